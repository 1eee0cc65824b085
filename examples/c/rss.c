/* Prints the resident memory of a C host after it opened a runtime (no model loaded). */
#include <stdio.h>
#include <string.h>

#include "common.h"
#include "rmtree.h"

int main(void) {
    char dir[] = "/tmp/correx-rss-XXXXXX";
    char config[512], line[256];
    correx_runtime *rt = NULL;
    FILE *f;
    if (!mkdtemp(dir)) return 1;
    snprintf(config, sizeof config, "{\"v\": 1, \"event_log\": \"%s/e.db\", \"sandbox_root\": \"%s/sb\"}", dir, dir);
    MUST("runtime", correx_runtime_new(config, &rt, &err));
    f = fopen("/proc/self/status", "r");
    while (f && fgets(line, sizeof line, f)) {
        if (strncmp(line, "VmRSS:", 6) == 0) fputs(line, stdout);
    }
    if (f) fclose(f);
    correx_runtime_free(rt);
    rmtree(dir);
    return 0;
}
