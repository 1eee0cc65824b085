/* Removes a directory tree (the examples' scratch directories). */
#ifndef CORREX_EXAMPLE_RMTREE_H
#define CORREX_EXAMPLE_RMTREE_H

#include <ftw.h>
#include <stdio.h>

static inline int rmtree_one_(const char *path, const struct stat *st, int flag, struct FTW *ftw) {
    (void)st;
    (void)flag;
    (void)ftw;
    return remove(path);
}

static inline void rmtree(const char *dir) {
    nftw(dir, rmtree_one_, 16, FTW_DEPTH | FTW_PHYS);
}

#endif
