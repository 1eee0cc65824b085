/* Tools alone: a read (T1, no approval), a write (T2, approved), an escape attempt (refused),
 * a shell command the approver denies, and a long one it approves that another thread cancels. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "common.h"
#include "minijson.h"
#include "rmtree.h"

static int32_t approve_writes(void *ud, const char *tool, int32_t tier, const char *req) {
    (void)ud;
    (void)tier;
    if (strcmp(tool, "shell") == 0 && strstr(req, "\"sleep\"")) return CORREX_APPROVE;
    return strcmp(tool, "file_write") == 0 ? CORREX_APPROVE : CORREX_DENY;
}

static void *cancel_soon(void *cancel) {
    struct timespec t = {0, 200 * 1000 * 1000};
    nanosleep(&t, NULL);
    correx_cancel_trigger(cancel);
    return NULL;
}

/* Runs one request; checks its status and, for a failure, its kind (NULL: any). */
static int run_kind(correx_runtime *rt, const char *request, const char *want_status,
                    const char *want_kind) {
    char *out = NULL;
    char status[32] = "", kind[32] = "";
    MUST("tool", correx_tool_execute(rt, request, &out, &err));
    mj_str(mj_get(out, "status"), status, sizeof status);
    mj_str(mj_get(out, "kind"), kind, sizeof kind);
    printf("  %s\n", out);
    correx_string_free(out);
    return strcmp(status, want_status) == 0 && (!want_kind || strcmp(kind, want_kind) == 0);
}

/* A line `key=value` of the MCP servers' install record ($CORREX_CACHE/mcp/env, written by
 * scripts/install-mcp.sh); 0 when there is none. */
static int mcp_env(const char *key, char *value, size_t size) {
    char path[1024], line[1024];
    const char *cache = getenv("CORREX_CACHE"), *xdg = getenv("XDG_CACHE_HOME"), *home = getenv("HOME");
    if (cache) snprintf(path, sizeof path, "%s/mcp/env", cache);
    else if (xdg) snprintf(path, sizeof path, "%s/correx/mcp/env", xdg);
    else if (home) snprintf(path, sizeof path, "%s/.cache/correx/mcp/env", home);
    else return 0;
    FILE *f = fopen(path, "r");
    if (!f) return 0;
    int found = 0;
    size_t klen = strlen(key);
    while (!found && fgets(line, sizeof line, f)) {
        if (strncmp(line, key, klen) == 0 && line[klen] == '=') {
            line[strcspn(line, "\n")] = 0;
            snprintf(value, size, "%s", line + klen + 1);
            found = 1;
        }
    }
    fclose(f);
    return found;
}

static int run(correx_runtime *rt, const char *request, const char *want_status) {
    return run_kind(rt, request, want_status, NULL);
}

/* What the host's MCP handler was asked, and whether a result that is not an object was
 * refused. Written by the handler's thread, read after the call returned. */
struct sampled {
    int calls, array_refused, good;
};

/* Answers server-everything's sampling request with a fixed completion. */
static int32_t sample(void *user_data, const char *server, const char *method, const char *params,
                      correx_mcp_answer *answer) {
    struct sampled *s = user_data;
    correx_error *e = NULL;
    s->calls++;
    s->good = strcmp(server, "ev") == 0 && strcmp(method, "sampling/createMessage") == 0 &&
              strstr(params, "which ship came first") != NULL && !correx_mcp_answer_cancelled(answer);
    if (!s->good) {
        correx_mcp_answer_refuse(answer, "not the request this test sent", NULL);
        return 1;
    }
    s->array_refused = correx_mcp_answer_set(answer, "[1, 2]", &e) == CORREX_E_INVALID_ARGUMENT;
    correx_error_free(e);
    return correx_mcp_answer_set(answer,
                                 "{\"role\": \"assistant\", \"content\": {\"type\": \"text\","
                                 " \"text\": \"the grain ship, from C\"}, \"model\": \"c-host\"}",
                                 NULL);
}

static void sampled_free(void *user_data) { ((struct sampled *)user_data)->calls += 1000; }

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
             "\"shell\": {\"enabled\": true, \"allowed_executables\": [\"ls\", \"sleep\"]}}}",
             dir, dir, dir, dir);
    MUST("runtime", correx_runtime_new(config, &rt, &err));
    MUST("approver", correx_runtime_set_approver(rt, approve_writes, NULL, NULL, &err));

    ok &= run(rt, "{\"v\":1,\"session_id\":\"t\",\"tool_name\":\"file_read\",\"parameters\":"
                  "{\"operation\":\"read\",\"path\":\"hello.txt\"}}", "success");
    ok &= run(rt, "{\"v\":1,\"session_id\":\"t\",\"tool_name\":\"file_write\",\"parameters\":"
                  "{\"operation\":\"write\",\"path\":\"out.txt\",\"content\":\"written\"}}", "success");
    ok &= run_kind(rt, "{\"v\":1,\"session_id\":\"t\",\"tool_name\":\"file_write\",\"parameters\":"
                       "{\"operation\":\"write\",\"path\":\"../escape.txt\",\"content\":\"x\"}}",
                   "failure", "escape");
    ok &= run_kind(rt, "{\"v\":1,\"session_id\":\"t\",\"tool_name\":\"shell\",\"parameters\":"
                       "{\"argv\":[\"ls\"]}}", "failure", "not_allowed");
    ok &= run_kind(rt, "{\"v\":1,\"session_id\":\"t\",\"tool_name\":\"file_read\",\"parameters\":"
                       "{\"operation\":\"read\",\"path\":\"missing.txt\"}}", "failure", "not_found");
    {
        char *out = NULL;
        MUST("tool", correx_tool_execute(
                         rt, "{\"v\":1,\"session_id\":\"t\",\"tool_name\":\"file_read\",\"parameters\":"
                             "{\"operation\":\"exists\",\"path\":\"hello.txt\"}}", &out, &err));
        ok &= strstr(out, "\"data\":{\"exists\":true}") != NULL;
        correx_string_free(out);
    }

    /* A 30 s run, cancelled from another thread after 200 ms: its processes are killed. */
    {
        correx_cancel *cancel = NULL;
        pthread_t thread;
        char *out = NULL, reason[256] = "";
        MUST("cancel", correx_cancel_new(&cancel, &err));
        if (pthread_create(&thread, NULL, cancel_soon, cancel) != 0) return 1;
        MUST("tool", correx_tool_execute_with_cancel(
                         rt, "{\"v\":1,\"session_id\":\"t\",\"tool_name\":\"shell\",\"parameters\":"
                             "{\"argv\":[\"sleep\",\"30\"]}}",
                         cancel, &out, &err));
        pthread_join(thread, NULL);
        mj_str(mj_get(out, "reason"), reason, sizeof reason);
        printf("  cancelled run: %.60s...\n", reason);
        /* Under valgrind, which does not know the Landlock syscalls, the shell refuses to run
         * unconfined; the plain and sanitizer runs check the cancel. */
        int unconfinable = strncmp(reason, "the shell cannot be confined", 28) == 0;
        ok &= unconfinable || strncmp(reason, "cancelled by the host", 21) == 0;
        /* The result says so as data too: the kind, and the run's fields. */
        ok &= unconfinable || (strstr(out, "\"kind\":\"cancelled\"") &&
                               strstr(out, "\"cancelled\":true") && strstr(out, "\"exit_code\""));
        correx_string_free(out);
        correx_cancel_free(cancel);
        MUST("events", correx_events_read_stream(rt, "session-t", 1, 100, &out, &err));
        ok &= unconfinable || strstr(out, "\"type_id\":\"tool.execution_cancelled\"") != NULL;
        correx_string_free(out);
    }
    /* A background job: started, listed, read, stopped; bad requests are errors; a session's
     * end ends its jobs. */
    {
        char *out = NULL, job[128] = "", request[512];
        correx_error *e = NULL;
        MUST("tool", correx_tool_execute(
                         rt, "{\"v\":1,\"session_id\":\"j\",\"tool_name\":\"shell\",\"parameters\":"
                             "{\"argv\":[\"sleep\",\"30\"],\"background\":true}}", &out, &err));
        int unconfinable = strstr(out, "the shell cannot be confined") != NULL;
        mj_str(mj_get(mj_get(out, "data"), "job_id"), job, sizeof job);
        correx_string_free(out);
        ok &= unconfinable || strncmp(job, "job-", 4) == 0;
        if (!unconfinable) {
            MUST("jobs list", correx_jobs(rt, "{\"v\":1,\"session_id\":\"j\",\"operation\":\"list\"}",
                                          NULL, &out, &err));
            ok &= strstr(out, job) != NULL && strstr(out, "\"state\":\"running\"") != NULL;
            correx_string_free(out);
            snprintf(request, sizeof request,
                     "{\"v\":1,\"session_id\":\"j\",\"operation\":\"stop\",\"job_id\":\"%s\"}", job);
            MUST("jobs stop", correx_jobs(rt, request, NULL, &out, &err));
            ok &= strstr(out, "\"reason\":\"stopped\"") != NULL;
            correx_string_free(out);
        }
        /* Another session's job, a wrong shape, an unknown operation: typed errors. */
        snprintf(request, sizeof request,
                 "{\"v\":1,\"session_id\":\"other\",\"operation\":\"read\",\"job_id\":\"%s\"}", job);
        ok &= correx_jobs(rt, request, NULL, &out, &e) == CORREX_E_INVALID_ARGUMENT;
        correx_error_free(e);
        e = NULL;
        ok &= correx_jobs(rt, "{\"v\":1,\"session_id\":[\"j\"],\"operation\":\"list\"}", NULL, &out,
                          &e) == CORREX_E_INVALID_ARGUMENT;
        correx_error_free(e);
        e = NULL;
        ok &= correx_jobs(rt, "{\"v\":1,\"session_id\":\"j\",\"operation\":\"explode\"}", NULL, &out,
                          &e) == CORREX_E_INVALID_ARGUMENT;
        correx_error_free(e);
        e = NULL;
        MUST("tool", correx_tool_execute(
                         rt, "{\"v\":1,\"session_id\":\"k\",\"tool_name\":\"shell\",\"parameters\":"
                             "{\"argv\":[\"sleep\",\"30\"],\"background\":true}}", &out, &err));
        correx_string_free(out);
        MUST("session end", correx_session_end(rt, "k", &err));
        MUST("jobs list", correx_jobs(rt, "{\"v\":1,\"session_id\":\"k\",\"operation\":\"list\"}", NULL,
                                      &out, &err));
        ok &= strstr(out, "\"jobs\":[]") != NULL;
        correx_string_free(out);
        printf("  background job %s\n", unconfinable ? "refused (unconfinable here)" : "started and stopped");
    }
    /* A durable session's tool step: run once, answered from the log after; another request
     * under its key is a conflict; bad input is a typed error; the transcript holds the result
     * under its call id. */
    {
        char *out = NULL;
        correx_error *e = NULL;
        const char *step = "{\"v\":1,\"tool_name\":\"file_write\",\"call_id\":\"c1\",\"parameters\":"
                           "{\"operation\":\"write\",\"path\":\"step.txt\",\"content\":\"once\"}}";
        MUST("session step", correx_session_execute(rt, "d", "w1", step, NULL, &out, &err));
        ok &= strstr(out, "\"status\":\"success\"") && strstr(out, "\"replayed\":false");
        correx_string_free(out);
        MUST("session step again", correx_session_execute(rt, "d", "w1", step, NULL, &out, &err));
        ok &= strstr(out, "\"replayed\":true") != NULL;
        correx_string_free(out);
        ok &= correx_session_execute(rt, "d", "w1",
                                     "{\"v\":1,\"tool_name\":\"file_write\",\"call_id\":\"c1\","
                                     "\"parameters\":{\"operation\":\"write\",\"path\":\"step.txt\","
                                     "\"content\":\"twice\"}}",
                                     NULL, &out, &e) == CORREX_E_CONFLICT;
        correx_error_free(e);
        e = NULL;
        ok &= correx_session_execute(rt, "d", "w2", "[1]", NULL, &out, &e) == CORREX_E_INVALID_ARGUMENT;
        correx_error_free(e);
        e = NULL;
        ok &= correx_session_execute(rt, "d", "", step, NULL, &out, &e) == CORREX_E_INVALID_ARGUMENT;
        correx_error_free(e);
        e = NULL;
        ok &= correx_session_execute(rt, NULL, "w3", step, NULL, &out, &e) == CORREX_E_NULL;
        correx_error_free(e);
        e = NULL;
        MUST("transcript", correx_session_transcript(rt, "d", &out, &err));
        ok &= strstr(out, "\"tool_call_id\":\"c1\"") != NULL;
        correx_string_free(out);
        MUST("events", correx_events_read_stream(rt, "session-d", 1, 100, &out, &err));
        int runs = 0;
        for (const char *p = out; (p = strstr(p, "\"tool.execution_started\"")); p++) runs++;
        ok &= runs == 1;
        correx_string_free(out);
        snprintf(req, sizeof req, "%s/step.txt", dir);
        f = fopen(req, "r");
        char got[16] = "";
        if (f) {
            if (!fgets(got, sizeof got, f)) got[0] = 0;
            fclose(f);
        }
        ok &= strcmp(got, "once") == 0;
        printf("  session step: ran %d time(s), file holds \"%s\"\n", runs, got);
    }
    correx_runtime_free(rt);

    /* An MCP server's tool (mcp-server-time, from PyPI): listed and called like a built-in. */
    {
        char cmd[512] = "", python[512] = "", venv[512], mcp_config[4096], *out = NULL;
        if (mcp_env("mcp_time", cmd, sizeof cmd) && mcp_env("mcp_python_home", python, sizeof python)) {
            correx_runtime *mrt = NULL;
            snprintf(venv, sizeof venv, "%s", cmd);
            for (int up = 0; up < 2; up++) *strrchr(venv, '/') = 0; /* .../venv/bin/x -> .../venv */
            snprintf(mcp_config, sizeof mcp_config,
                     "{\"v\": 1, \"event_log\": \"%s/mcp-events.db\", \"sandbox_root\": \"%s/msb\","
                     " \"mcp_servers\": {\"time\": {\"command\": [\"%s\"], \"tier\": 1,"
                     " \"isolation\": {\"read_paths\": [\"%s\", \"%s\"]%s}}},"
                     " \"approvals\": {\"engine\": \"auto\", \"max_tier\": 1}}",
                     dir, dir, cmd, venv, python,
                     geteuid() == 0 ? ", \"run_as\": \"host\"" : "");
            MUST("runtime", correx_runtime_new(mcp_config, &mrt, &err));
            MUST("tools list", correx_tools_list(mrt, &out, &err));
            /* Under valgrind, which does not know the Landlock syscalls, the server cannot be
             * confined as required and is listed as one disabled entry saying so. */
            int unconfinable = strstr(out, "\"time.*\"") != NULL && strstr(out, "cannot be confined") != NULL;
            ok &= unconfinable || strstr(out, "\"time.get_current_time\"") != NULL;
            correx_string_free(out);
            ok &= run(mrt, "{\"v\":1,\"session_id\":\"m\",\"tool_name\":\"time.get_current_time\","
                           "\"parameters\":{\"timezone\":\"UTC\"}}",
                      unconfinable ? "failure" : "success");
            ok &= run_kind(mrt, "{\"v\":1,\"session_id\":\"m\",\"tool_name\":\"time.get_current_time\","
                                "\"parameters\":{\"timezone\":[\"UTC\"]}}",
                           "failure", "invalid_request") || unconfinable;
            correx_runtime_free(mrt);
            printf("  mcp tool %s\n", unconfinable ? "refused (unconfinable here)" : "listed and called");
        } else if (getenv("CI") && strcmp(getenv("CI"), "true") == 0) {
            printf("  the MCP servers are not installed; CI must run scripts/install-mcp.sh\n");
            ok = 0;
        } else {
            printf("  !!! SKIPPING the MCP tool: run scripts/install-mcp.sh !!!\n");
        }
    }

    /* A server's sampling request (server-everything, from npm) answered by the host. */
    {
        char node[512] = "", index[512] = "", pkg[512], mcp_config[4096], *out = NULL;
        if (mcp_env("node", node, sizeof node) && mcp_env("mcp_everything", index, sizeof index)) {
            correx_runtime *mrt = NULL;
            struct sampled s = {0, 0, 0};
            snprintf(pkg, sizeof pkg, "%s", index);
            /* .../node_modules/@modelcontextprotocol/server-everything/dist/index.js -> node_modules */
            for (int up = 0; up < 4; up++) *strrchr(pkg, '/') = 0;
            snprintf(mcp_config, sizeof mcp_config,
                     "{\"v\": 1, \"event_log\": \"%s/mcp2-events.db\", \"sandbox_root\": \"%s/msb2\","
                     " \"mcp_servers\": {\"ev\": {\"command\": [\"%s\", \"%s\", \"stdio\"], \"tier\": 1,"
                     " \"startup_timeout_ms\": 60000,"
                     " \"isolation\": {\"read_paths\": [\"%s\"]%s}}},"
                     " \"approvals\": {\"engine\": \"auto\", \"max_tier\": 1}}",
                     dir, dir, node, index, pkg, geteuid() == 0 ? ", \"run_as\": \"host\"" : "");
            MUST("runtime", correx_runtime_new(mcp_config, &mrt, &err));
            ok &= correx_runtime_set_mcp_handler(mrt, 0, sample, &s, NULL, NULL) == CORREX_E_INVALID_ARGUMENT;
            ok &= correx_runtime_set_mcp_handler(mrt, 8, sample, &s, NULL, NULL) == CORREX_E_INVALID_ARGUMENT;
            MUST("mcp handler", correx_runtime_set_mcp_handler(mrt, CORREX_MCP_SAMPLING, sample, &s, sampled_free, &err));
            MUST("tools list", correx_tools_list(mrt, &out, &err));
            /* As above; a server that fails to start for any other reason fails the test. */
            int unconfinable = strstr(out, "\"ev.*\"") != NULL && strstr(out, "cannot be confined") != NULL;
            /* The server offers its sampling tool only to a client that said it samples. */
            ok &= unconfinable || strstr(out, "\"ev.trigger-sampling-request\"") != NULL;
            correx_string_free(out);
            if (!unconfinable) {
                char status[32] = "";
                MUST("tool", correx_tool_execute(mrt,
                    "{\"v\":1,\"session_id\":\"m\",\"tool_name\":\"ev.trigger-sampling-request\","
                    "\"parameters\":{\"prompt\":\"which ship came first?\",\"maxTokens\":16}}", &out, &err));
                mj_str(mj_get(out, "status"), status, sizeof status);
                printf("  %s\n", out);
                ok &= strcmp(status, "success") == 0 && strstr(out, "the grain ship, from C") != NULL;
                correx_string_free(out);
                ok &= s.calls == 1 && s.good && s.array_refused;
            }
            correx_runtime_free(mrt);
            /* Freeing the runtime released the handler's user_data, once. */
            ok &= s.calls == (unconfinable ? 1000 : 1001);
            printf("  mcp sampling %s\n", unconfinable ? "refused (unconfinable here)" : "answered by the host");
        } else if (getenv("CI") && strcmp(getenv("CI"), "true") == 0) {
            printf("  the MCP servers are not installed; CI must run scripts/install-mcp.sh\n");
            ok = 0;
        } else {
            printf("  !!! SKIPPING the MCP sampling: run scripts/install-mcp.sh !!!\n");
        }
    }
    rmtree(dir);
    printf(ok ? "tools: all as expected\n" : "tools: UNEXPECTED RESULT\n");
    return ok ? 0 : 1;
}
