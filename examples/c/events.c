/* The event log alone: append with optimistic concurrency, read a stream, read everything,
 * and follow it with a subscription while another process appends. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common.h"
#include "minijson.h"
#include "rmtree.h"

/* The other process: opens the same log and appends one event. */
static int append_from_another_process(const char *dir) {
    char config[512];
    correx_runtime *rt = NULL;
    usleep(100 * 1000);
    snprintf(config, sizeof config,
             "{\"v\": 1, \"event_log\": \"%s/events.db\", \"sandbox_root\": \"%s/sb2\"}", dir, dir);
    MUST("runtime (other process)", correx_runtime_new(config, &rt, &err));
    MUST("append (other process)",
         correx_events_append(rt, "notes", CORREX_EXPECT_ANY, 0,
                              "{\"v\": 1, \"events\": [{\"type_id\": \"note.added\", "
                              "\"payload\": {\"text\": \"from elsewhere\"}}]}",
                              NULL, &err));
    correx_runtime_free(rt);
    return 0;
}

int main(int argc, char **argv) {
    if (argc == 3 && strcmp(argv[1], "--append") == 0) return append_from_another_process(argv[2]);
    char dir[] = "/tmp/correx-events-XXXXXX";
    char config[512];
    correx_runtime *rt = NULL;
    correx_error *err = NULL;
    char *out = NULL;
    uint64_t last = 0;
    int32_t rc;
    const char *e;
    int n = 0;

    if (!mkdtemp(dir)) return 1;
    snprintf(config, sizeof config,
             "{\"v\": 1, \"event_log\": \"%s/events.db\", \"sandbox_root\": \"%s/sb\"}", dir, dir);
    MUST("runtime", correx_runtime_new(config, &rt, &err));

    MUST("append", correx_events_append(rt, "notes", CORREX_EXPECT_NO_STREAM, 0,
                                        "{\"v\": 1, \"events\": [{\"type_id\": \"note.added\", "
                                        "\"payload\": {\"text\": \"first\"}}, {\"type_id\": "
                                        "\"note.added\", \"payload\": {\"text\": \"second\"}}]}",
                                        &out, &err));
    printf("appended: %s\n", out);
    correx_string_free(out);

    /* A writer that expects the wrong version gets a conflict, not a silent overwrite. */
    rc = correx_events_append(rt, "notes", CORREX_EXPECT_EXACT, 7,
                              "{\"v\": 1, \"events\": [{\"type_id\": \"note.added\"}]}", NULL, &err);
    printf("stale writer: status %d (%s)\n", rc, correx_error_message(err));
    correx_error_free(err);
    if (rc != CORREX_E_CONFLICT) return 1;

    MUST("append exact", correx_events_append(rt, "notes", CORREX_EXPECT_EXACT, 2,
                                              "{\"v\": 1, \"events\": [{\"type_id\": \"note.added\", "
                                              "\"payload\": {\"text\": \"third\"}}]}",
                                              NULL, &err));

    MUST("read stream", correx_events_read_stream(rt, "notes", 1, 100, &out, &err));
    for (e = mj_first(mj_get(out, "events")); e; e = mj_next(e)) {
        char text[64] = "";
        mj_str(mj_get(mj_get(e, "payload"), "text"), text, sizeof text);
        printf("  v%lld @%lld: %s\n", mj_int(mj_get(e, "stream_version"), 0),
               mj_int(mj_get(e, "position"), 0), text);
        n++;
    }
    correx_string_free(out);
    MUST("last position", correx_events_last_position(rt, &last, &err));
    printf("%d events in the stream, last position %llu\n", n, (unsigned long long)last);

    /* Follow the log: history after position 1, then what another process appends. */
    correx_subscription *sub = NULL;
    int followed = 0;
    MUST("subscribe", correx_subscribe(rt, 1, &sub, &err));
    pid_t child = fork();
    if (child == 0) {
        /* argv[0], not /proc/self/exe: under valgrind that is valgrind itself. */
        execl(argv[0], argv[0], "--append", dir, (char *)NULL);
        _exit(127);
    }
    for (;;) {
        MUST("next", correx_subscription_next(sub, 5000, &out, &err));
        if (!out) break; /* nothing for 5 s */
        char text[64] = "";
        mj_str(mj_get(mj_get(out, "payload"), "text"), text, sizeof text);
        printf("  followed @%lld: %s\n", mj_int(mj_get(out, "position"), 0), text);
        correx_string_free(out);
        if (++followed == 3) break;
    }
    int status = 0;
    waitpid(child, &status, 0);
    printf("followed %d events, at position %llu\n", followed,
           (unsigned long long)correx_subscription_position(sub));
    int ok = followed == 3 && correx_subscription_position(sub) == 4 && WIFEXITED(status) &&
             WEXITSTATUS(status) == 0;
    MUST("next (nothing new)", correx_subscription_next(sub, 0, &out, &err));
    ok = ok && out == NULL;

    /* The metrics: Prometheus text; the log's position is the last append's. */
    char *metrics = NULL;
    MUST("metrics", correx_metrics(rt, &metrics, &err));
    int metrics_ok = strstr(metrics, "\ncorrex_log_position 4\n") != NULL &&
                     strstr(metrics, "# TYPE correx_log_append_duration_seconds histogram") != NULL;
    printf("metrics: %zu bytes, %s\n", strlen(metrics), metrics_ok ? "position 4" : metrics);
    correx_string_free(metrics);
    ok = ok && metrics_ok && correx_metrics(rt, NULL, NULL) == CORREX_E_NULL;
    correx_subscription_free(sub);
    correx_subscription_free(NULL);
    correx_runtime_free(rt);
    rmtree(dir);
    return (n == 3 && last == 3 && ok) ? 0 : 1;
}
