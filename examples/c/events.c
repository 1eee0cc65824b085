/* The event log alone: append with optimistic concurrency, read a stream, read everything. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"
#include "minijson.h"
#include "rmtree.h"

int main(void) {
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
    correx_runtime_free(rt);
    rmtree(dir);
    return (n == 3 && last == 3) ? 0 : 1;
}
