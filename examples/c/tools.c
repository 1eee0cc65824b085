/* Tools alone: a read (T1, no approval), a write (T2, approved), an escape attempt (refused),
 * and a shell command the approver denies. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"
#include "minijson.h"
#include "rmtree.h"

static int32_t approve_writes(void *ud, const char *tool, int32_t tier, const char *req) {
    (void)ud;
    (void)tier;
    (void)req;
    return strcmp(tool, "file_write") == 0 ? CORREX_APPROVE : CORREX_DENY;
}

static int run(correx_runtime *rt, const char *request, const char *want_status) {
    char *out = NULL;
    char status[32] = "";
    MUST("tool", correx_tool_execute(rt, request, &out, &err));
    mj_str(mj_get(out, "status"), status, sizeof status);
    printf("  %s\n", out);
    correx_string_free(out);
    return strcmp(status, want_status) == 0;
}

int main(void) {
    char dir[] = "/tmp/correx-tools-XXXXXX";
    char config[1024], req[1024];
    correx_runtime *rt = NULL;
    int ok = 1;
    FILE *f;

    if (!mkdtemp(dir)) return 1;
    snprintf(req, sizeof req, "%s/hello.txt", dir);
    f = fopen(req, "w");
    if (!f) return 1;
    fputs("hello from a file\n", f);
    fclose(f);
    snprintf(config, sizeof config,
             "{\"v\": 1, \"event_log\": \"%s/events.db\", \"sandbox_root\": \"%s/sb\", \"tools\": {"
             "\"file_read\": {\"enabled\": true, \"allowed_paths\": [\"%s\"]},"
             "\"file_write\": {\"enabled\": true, \"allowed_paths\": [\"%s\"]},"
             "\"shell\": {\"enabled\": true, \"allowed_executables\": [\"ls\"]}}}",
             dir, dir, dir, dir);
    MUST("runtime", correx_runtime_new(config, &rt, &err));
    MUST("approver", correx_runtime_set_approver(rt, approve_writes, NULL, NULL, &err));

    ok &= run(rt, "{\"v\":1,\"session_id\":\"t\",\"tool_name\":\"file_read\",\"parameters\":"
                  "{\"operation\":\"read\",\"path\":\"hello.txt\"}}", "success");
    ok &= run(rt, "{\"v\":1,\"session_id\":\"t\",\"tool_name\":\"file_write\",\"parameters\":"
                  "{\"operation\":\"write\",\"path\":\"out.txt\",\"content\":\"written\"}}", "success");
    ok &= run(rt, "{\"v\":1,\"session_id\":\"t\",\"tool_name\":\"file_write\",\"parameters\":"
                  "{\"operation\":\"write\",\"path\":\"../escape.txt\",\"content\":\"x\"}}", "failure");
    ok &= run(rt, "{\"v\":1,\"session_id\":\"t\",\"tool_name\":\"shell\",\"parameters\":"
                  "{\"argv\":[\"ls\"]}}", "failure");
    correx_runtime_free(rt);
    rmtree(dir);
    printf(ok ? "tools: all as expected\n" : "tools: UNEXPECTED RESULT\n");
    return ok ? 0 : 1;
}
