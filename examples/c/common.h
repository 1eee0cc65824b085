/* Shared by the examples: fail loudly on an unexpected status. */
#ifndef CORREX_EXAMPLE_COMMON_H
#define CORREX_EXAMPLE_COMMON_H

#include <stdio.h>
#include <stdlib.h>

#include "correx.h"

/* Prints (when it failed) and frees an error; returns the status. */
static inline int32_t report_error(const char *what, int32_t rc, correx_error *err) {
    if (rc != CORREX_OK) {
        fprintf(stderr, "%s: error %d: %s\n", what, correx_error_code(err),
                correx_error_message(err));
    }
    correx_error_free(err);
    return rc;
}

/* Runs `expr`, which takes `&err` as its last argument; exits with the message on failure. */
#define MUST(what, expr)                                                                  \
    do {                                                                                  \
        correx_error *err = NULL;                                                         \
        int32_t must_rc_ = (expr);                                                        \
        if (report_error(what, must_rc_, err) != CORREX_OK) exit(1);                      \
    } while (0)

#endif
