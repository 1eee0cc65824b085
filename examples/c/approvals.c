/* Approval policy from C: config rules allow and forbid shell commands without asking (the
 * decisions come before a run: under valgrind, where the shell refuses to run unconfined, they
 * are the same); the
 * callback sees the request's context and answers CORREX_APPROVE_FOR_SESSION, which covers the
 * same tool and argv prefix in that session only; an invalid request never reaches it; every
 * decision is in the log with who decided. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"
#include "rmtree.h"

static int calls;
static int saw_context;

static int32_t approver(void *ud, const char *tool, int32_t tier, const char *req) {
    (void)ud;
    calls++;
    if (strstr(req, "\"context\":{") && strstr(req, "\"tier\":2") &&
        (strcmp(tool, "shell") != 0 || strstr(req, "\"argv\":[\"ls\",\"-l\"")))
        saw_context++;
    if (tier >= 2 && strcmp(tool, "shell") == 0) return CORREX_APPROVE_FOR_SESSION;
    return CORREX_APPROVE;
}

static void run(correx_runtime *rt, const char *session, const char *tool, const char *params) {
    char request[1024];
    char *out = NULL;
    snprintf(request, sizeof request,
             "{\"v\":1,\"session_id\":\"%s\",\"tool_name\":\"%s\",\"parameters\":%s}", session, tool,
             params);
    MUST("tool", correx_tool_execute(rt, request, &out, &err));
    correx_string_free(out);
}

static int count(const char *haystack, const char *needle) {
    int n = 0;
    for (const char *p = strstr(haystack, needle); p; p = strstr(p + 1, needle)) n++;
    return n;
}

int main(void) {
    char dir[] = "/tmp/correx-approvals-XXXXXX";
    char config[2048];
    correx_runtime *rt = NULL;
    char *log_a = NULL, *log_b = NULL;
    int ok = 1;

    if (!mkdtemp(dir)) return 1;
    snprintf(config, sizeof config,
             "{\"v\": 1, \"event_log\": \"%s/events.db\", \"sandbox_root\": \"%s/sb\", \"tools\": {"
             "\"file_write\": {\"enabled\": true, \"allowed_paths\": [\"%s\"]},"
             "\"shell\": {\"enabled\": true, \"allowed_executables\": [\"ls\", \"echo\"]}},"
             "\"approvals\": {\"engine\": \"callback\", \"rules\": ["
             "{\"tool\": \"shell\", \"argv_prefix\": [\"ls\", \"-a\"], \"action\": \"allow\"},"
             "{\"tool\": \"shell\", \"argv_prefix\": [\"echo\"], \"action\": \"forbid\"}]}}",
             dir, dir, dir);
    MUST("runtime", correx_runtime_new(config, &rt, &err));
    MUST("approver", correx_runtime_set_approver(rt, approver, NULL, NULL, &err));

    run(rt, "a", "shell", "{\"argv\":[\"ls\",\"-a\"]}");     /* rule: allow, not asked */
    run(rt, "a", "shell", "{\"argv\":[\"echo\",\"hi\"]}");   /* rule: forbid, not asked */
    ok &= calls == 0;
    run(rt, "a", "shell", "{\"argv\":[\"ls\",\"-l\"]}");     /* asked: approved for session */
    run(rt, "a", "shell", "{\"argv\":[\"ls\",\"-l\",\"-h\"]}"); /* covered: not asked */
    ok &= calls == 1;
    run(rt, "b", "shell", "{\"argv\":[\"ls\",\"-l\"]}");     /* another session: asked */
    run(rt, "a", "shell", "{\"argv\":[\"ls\",\"/\"]}");      /* another prefix: asked */
    run(rt, "a", "file_write", "{\"operation\":\"write\",\"path\":\"x.txt\"}"); /* invalid */
    ok &= calls == 3;
    run(rt, "a", "file_write", "{\"operation\":\"write\",\"path\":\"x.txt\",\"content\":\"x\"}");
    ok &= calls == 4 && saw_context >= 3;

    MUST("log", correx_events_read_stream(rt, "session-a", 1, 100, &log_a, &err));
    MUST("log", correx_events_read_stream(rt, "session-b", 1, 100, &log_b, &err));
    ok &= count(log_a, "\"type_id\":\"tool.approval_decided\"") == 6;
    ok &= count(log_a, "\"decided_by\":\"rule: shell [\\\"ls\\\",\\\"-a\\\"] allow\"") == 1;
    ok &= count(log_a, "\"decided_by\":\"rule: shell [\\\"echo\\\"] forbid\"") == 1;
    ok &= count(log_a, "\"decided_by\":\"session\"") == 1;
    ok &= count(log_a, "\"decided_by\":\"host\"") == 3;
    ok &= count(log_a, "\"decision\":\"approved_for_session\"") == 2;
    ok &= count(log_b, "\"decided_by\":\"host\"") == 1;
    /* The invalid request is rejected without a decision. */
    ok &= count(log_a, "invalid request") >= 1;
    if (!ok) printf("calls %d, context %d\nsession a: %s\n", calls, saw_context, log_a);
    correx_string_free(log_a);
    correx_string_free(log_b);
    correx_runtime_free(rt);
    rmtree(dir);
    printf(ok ? "approvals: all as expected\n" : "approvals: UNEXPECTED RESULT\n");
    return ok ? 0 : 1;
}
