/* The correx main job, from C: open the event log, load the Gemma model, ask it a question
 * (the answer printed as it streams; a long one stopped after five pieces), run a file_write (T2) that the approval callback approves and a shell call that it denies,
 * then print the event log as a timeline.
 *
 * Needs llama-server and the model: `make run-demo` installs them first. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common.h"
#include "minijson.h"
#include "rmtree.h"

/* Approves file_write; denies everything else. */
static int32_t approve(void *user_data, const char *tool, int32_t tier, const char *request_json) {
    int *asked = (int *)user_data;
    int yes = strcmp(tool, "file_write") == 0;
    (void)request_json;
    (*asked)++;
    printf("  approver: %s (T%d) -> %s\n", tool, (int)tier, yes ? "APPROVE" : "DENY");
    return yes ? CORREX_APPROVE : CORREX_DENY;
}

/* Copies `in` into `out` as the inside of a JSON string. */
/* Streaming: prints each piece of the answer as it arrives and keeps the whole text. */
struct streamed {
    char text[256];
    size_t len;
    int pieces;
    int stop_after; /* 0: never stop */
};

static int32_t on_chunk(void *user_data, int32_t kind, const char *text, size_t len) {
    struct streamed *s = user_data;
    if (kind != CORREX_CHUNK_TEXT) return CORREX_CONTINUE;
    fwrite(text, 1, len, stdout);
    fflush(stdout);
    if (s->len + len < sizeof s->text) {
        memcpy(s->text + s->len, text, len);
        s->len += len;
        s->text[s->len] = 0;
    }
    s->pieces++;
    return s->stop_after && s->pieces >= s->stop_after ? 1 : CORREX_CONTINUE;
}

static void json_escape(const char *in, char *out, size_t n) {
    size_t o = 0;
    for (; *in && o + 7 < n; in++) {
        unsigned char c = (unsigned char)*in;
        if (c == '"' || c == '\\') {
            out[o++] = '\\';
            out[o++] = (char)c;
        } else if (c < 0x20) {
            o += (size_t)snprintf(out + o, n - o, "\\u%04x", c);
        } else {
            out[o++] = (char)c;
        }
    }
    out[o] = '\0';
}

static void run_tool(correx_runtime *rt, const char *request) {
    char *result = NULL;
    char status[32] = "", text[512] = "";
    MUST("tool", correx_tool_execute(rt, request, &result, &err));
    mj_str(mj_get(result, "status"), status, sizeof status);
    if (mj_str(mj_get(result, "output"), text, sizeof text) != 0) {
        mj_str(mj_get(result, "reason"), text, sizeof text);
    }
    printf("  result: %s: %s\n", status, text);
    correx_string_free(result);
}

static void print_timeline(correx_runtime *rt) {
    uint64_t from = 1;
    printf("\nEvent log:\n");
    for (;;) {
        char *page = NULL;
        const char *e;
        int n = 0;
        MUST("read events", correx_events_read_all(rt, from, 100, &page, &err));
        for (e = mj_first(mj_get(page, "events")); e; e = mj_next(e)) {
            char ts[64] = "", stream[128] = "", type[64] = "", summary[400] = "";
            mj_str(mj_get(e, "timestamp"), ts, sizeof ts);
            mj_str(mj_get(e, "stream_id"), stream, sizeof stream);
            mj_str(mj_get(e, "type_id"), type, sizeof type);
            mj_str(mj_get(e, "summary"), summary, sizeof summary);
            printf("  #%-3lld %s  %-16s %-26s %s\n", mj_int(mj_get(e, "position"), 0), ts, stream,
                   type, summary);
            from = (uint64_t)mj_int(mj_get(e, "position"), 0) + 1;
            n++;
        }
        correx_string_free(page);
        if (n == 0) break;
    }
}

int main(void) {
    char dir[256] = "/tmp/correx-demo-XXXXXX";
    /* CORREX_DEMO_DIR: work in that (existing) directory and keep it, e.g. for a process
     * following the log (scripts/jvm-demo.sh). */
    const char *given = getenv("CORREX_DEMO_DIR");
    char config[2048], request[4096], escaped[1200];
    correx_runtime *rt = NULL;
    char *answer = NULL;
    char text[200] = "", finish[32] = "";
    const char *usage;
    struct streamed streamed = {0};
    int asked = 0;

    if (given) {
        snprintf(dir, sizeof dir, "%s", given);
    } else if (!mkdtemp(dir)) {
        perror("mkdtemp");
        return 1;
    }
    printf("correx %d.%d.%d demo, working in %s\n", CORREX_ABI_VERSION_MAJOR,
           CORREX_ABI_VERSION_MINOR, CORREX_ABI_VERSION_PATCH, dir);
    snprintf(config, sizeof config,
             "{\"v\": 1, \"event_log\": \"%s/events.db\", \"sandbox_root\": \"%s/sandbox\","
             " \"tools\": {\"file_write\": {\"enabled\": true, \"allowed_paths\": [\"%s\"]},"
             " \"shell\": {\"enabled\": true, \"allowed_executables\": [\"ls\"]}},"
             " \"models\": {\"port\": 18431, \"log_dir\": \"%s/logs\"}}",
             dir, dir, dir, dir);
    MUST("runtime", correx_runtime_new(config, &rt, &err));
    MUST("approver", correx_runtime_set_approver(rt, approve, &asked, NULL, &err));

    printf("\nLoading gemma-3-270m...\n");
    MUST("load", correx_model_load(rt,
                                   "{\"v\": 1, \"model_id\": \"gemma-3-270m\", \"residency\": "
                                   "\"persistent\", \"context_size\": 2048, \"extra_args\": "
                                   "[\"--no-jinja\", \"--chat-template\", \"gemma\"]}",
                                   NULL, &err));

    {
        char *status = NULL;
        MUST("status", correx_models_status(rt, &status, &err));
        for (const char *m = mj_first(mj_get(status, "models")); m; m = mj_next(m)) {
            char id[64] = "", state[16] = "";
            mj_str(mj_get(m, "model_id"), id, sizeof id);
            mj_str(mj_get(m, "state"), state, sizeof state);
            printf("  status: %s %s, pid %lld, port %lld, %lld MiB resident, %lld in flight\n", id,
                   state, mj_int(mj_get(m, "pid"), -1), mj_int(mj_get(m, "port"), -1),
                   mj_int(mj_get(m, "rss_bytes"), 0) >> 20, mj_int(mj_get(m, "in_flight"), -1));
        }
        correx_string_free(status);
    }

    printf("\nAsking: What is the capital of France?\n");
    /* Gemma 3 270M is a small base model: a few examples of the answer's shape (the L2
     * history) and a short budget get a one-word answer out of it. */
    printf("  streamed: ");
    MUST("infer", correx_infer_stream(rt, "gemma-3-270m",
                               "{\"v\": 1, \"context\": {\"entries\": ["
                               "{\"source\": \"user\", \"content\": \"What is the capital of Italy?\"},"
                               "{\"source\": \"model\", \"content\": \"Rome.\"},"
                               "{\"source\": \"user\", \"content\": \"What is the capital of Germany?\"},"
                               "{\"source\": \"model\", \"content\": \"Berlin.\"},"
                               "{\"source\": \"user\", \"content\": \"What is the capital of France?\"}]},"
                               " \"config\": {\"temperature\": 0, \"max_tokens\": 2, \"seed\": 7}}",
                               NULL, on_chunk, &streamed, &answer, &err));
    printf("\n");
    mj_str(mj_get(answer, "text"), text, sizeof text);
    if (strcmp(text, streamed.text) != 0) {
        fprintf(stderr, "the streamed pieces (%s) differ from the answer (%s)\n", streamed.text, text);
        return 1;
    }
    mj_str(mj_get(answer, "finish_reason"), finish, sizeof finish);
    usage = mj_get(answer, "usage");
    printf("  answer: %s\n", text);
    printf("  usage: %lld prompt + %lld completion = %lld tokens (%s, %lld ms)\n",
           mj_int(mj_get(usage, "prompt_tokens"), -1), mj_int(mj_get(usage, "completion_tokens"), -1),
           mj_int(mj_get(usage, "total_tokens"), -1), finish, mj_int(mj_get(answer, "latency_ms"), -1));
    correx_string_free(answer);

    printf("\nA long answer, stopped by the callback after 5 pieces:\n  ");
    struct streamed story = {.stop_after = 5};
    correx_error *err = NULL;
    int32_t stopped = correx_infer_stream(
        rt, "gemma-3-270m",
        "{\"v\": 1, \"context\": {\"task\": \"Write a long story about the sea.\"},"
        " \"config\": {\"temperature\": 0, \"max_tokens\": 2000, \"seed\": 7}}",
        NULL, on_chunk, &story, &answer, &err);
    printf("\n  -> %s after %d pieces (its connection closed, so llama-server stops decoding)\n",
           stopped == CORREX_E_CANCELLED ? "CORREX_E_CANCELLED" : "unexpected", story.pieces);
    if (stopped != CORREX_E_CANCELLED || story.pieces != 5) return 1;
    correx_error_free(err);
    err = NULL;

    /* A durable session step: the first call asks the model and records the answer; the
     * same step again (after a crash, from another process) is answered from the log. */
    printf("\nA durable session step, called twice:\n");
    {
        const char *ask = "{\"v\": 1, \"context\": {\"entries\": ["
                          "{\"source\": \"user\", \"content\": \"What is the capital of Italy?\"},"
                          "{\"source\": \"model\", \"content\": \"Rome.\"},"
                          "{\"source\": \"user\", \"content\": \"What is the capital of Spain?\"}]},"
                          " \"config\": {\"temperature\": 0, \"max_tokens\": 2, \"seed\": 7}}";
        char *first = NULL, *again = NULL, t1[128] = "", t2[128] = "";
        MUST("session step", correx_session_infer(rt, "demo", "turn-1", "gemma-3-270m", ask, NULL,
                                                  NULL, NULL, &first, &err));
        MUST("session step again", correx_session_infer(rt, "demo", "turn-1", "gemma-3-270m", ask,
                                                        NULL, NULL, NULL, &again, &err));
        mj_str(mj_get(first, "text"), t1, sizeof t1);
        mj_str(mj_get(again, "text"), t2, sizeof t2);
        int replayed = strstr(again, "\"replayed\":true") != NULL;
        printf("  first: %s (asked the model)\n  again: %s (%s)\n", t1, t2,
               replayed ? "answered from the log" : "ASKED AGAIN");
        correx_string_free(first);
        correx_string_free(again);
        if (!replayed || strcmp(t1, t2) != 0) return 1;
    }

    json_escape(text, escaped, sizeof escaped);
    printf("\nfile_write %s/answer.txt (T2):\n", dir);
    snprintf(request, sizeof request,
             "{\"v\": 1, \"session_id\": \"demo\", \"tool_name\": \"file_write\", \"parameters\":"
             " {\"operation\": \"write\", \"path\": \"answer.txt\", \"content\": \"%s\\n\"}}",
             escaped);
    run_tool(rt, request);

    printf("\nshell ls -l %s (T2):\n", dir);
    snprintf(request, sizeof request,
             "{\"v\": 1, \"session_id\": \"demo\", \"tool_name\": \"shell\", \"parameters\":"
             " {\"argv\": [\"ls\", \"-l\", \"%s\"]}}",
             dir);
    run_tool(rt, request);

    MUST("unload", correx_model_unload(rt, "gemma-3-270m", &err));
    print_timeline(rt);
    printf("\nThe approver was asked %d times.\n", asked);
    correx_runtime_free(rt);
    if (!getenv("CORREX_DEMO_KEEP") && !given) rmtree(dir);
    return asked == 2 ? 0 : 1;
}
