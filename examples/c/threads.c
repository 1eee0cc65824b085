/* 8 threads share one runtime: tool calls (a T1 read and an approved T2 write each) and event
 * reads, with no error. Run under ASan and valgrind by the Makefile. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"
#include "minijson.h"
#include "rmtree.h"

#define THREADS 8
#define ROUNDS 25

static correx_runtime *rt;
static int errors;
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;

static int32_t approve(void *ud, const char *tool, int32_t tier, const char *req) {
    (void)ud;
    (void)tier;
    (void)req;
    return strcmp(tool, "file_write") == 0 ? CORREX_APPROVE : CORREX_DENY;
}

static void fail(const char *what) {
    pthread_mutex_lock(&lock);
    errors++;
    fprintf(stderr, "thread error: %s\n", what);
    pthread_mutex_unlock(&lock);
}

static void *worker(void *arg) {
    int id = (int)(size_t)arg;
    char req[512];
    int i;
    for (i = 0; i < ROUNDS; i++) {
        char *out = NULL;
        correx_error *err = NULL;
        char status[16] = "";
        snprintf(req, sizeof req,
                 "{\"v\":1,\"session_id\":\"t%d\",\"tool_name\":\"file_write\",\"parameters\":"
                 "{\"operation\":\"write\",\"path\":\"f%d.txt\",\"content\":\"round %d\"}}",
                 id, id, i);
        if (correx_tool_execute(rt, req, &out, &err) != CORREX_OK) fail(correx_error_message(err));
        mj_str(mj_get(out, "status"), status, sizeof status);
        if (strcmp(status, "success") != 0) fail(out ? out : "no result");
        correx_string_free(out);
        out = NULL;
        snprintf(req, sizeof req,
                 "{\"v\":1,\"session_id\":\"t%d\",\"tool_name\":\"file_read\",\"parameters\":"
                 "{\"operation\":\"read\",\"path\":\"f%d.txt\"}}",
                 id, id);
        if (correx_tool_execute(rt, req, &out, &err) != CORREX_OK) fail(correx_error_message(err));
        correx_string_free(out);
        out = NULL;
        if (correx_events_read_all(rt, 1, 50, &out, &err) != CORREX_OK) fail(correx_error_message(err));
        correx_string_free(out);
        correx_error_free(err);
    }
    return NULL;
}

int main(void) {
    char dir[] = "/tmp/correx-threads-XXXXXX";
    char config[1024];
    pthread_t t[THREADS];
    uint64_t last = 0;
    int i;

    if (!mkdtemp(dir)) return 1;
    snprintf(config, sizeof config,
             "{\"v\": 1, \"event_log\": \"%s/events.db\", \"sandbox_root\": \"%s/sb\", \"tools\": {"
             "\"file_read\": {\"enabled\": true, \"allowed_paths\": [\"%s\"]},"
             "\"file_write\": {\"enabled\": true, \"allowed_paths\": [\"%s\"]}}}",
             dir, dir, dir, dir);
    MUST("runtime", correx_runtime_new(config, &rt, &err));
    MUST("approver", correx_runtime_set_approver(rt, approve, NULL, NULL, &err));
    for (i = 0; i < THREADS; i++) pthread_create(&t[i], NULL, worker, (void *)(size_t)i);
    for (i = 0; i < THREADS; i++) pthread_join(t[i], NULL);
    MUST("last", correx_events_last_position(rt, &last, &err));
    correx_runtime_free(rt);
    rmtree(dir);
    /* Each round: write (approval decided, started, completed) and read (started, completed:
     * a T1 tool needs no decision). */
    printf("threads: %d errors, %llu events (want %d)\n", errors, (unsigned long long)last,
           THREADS * ROUNDS * 5);
    return (errors == 0 && last == THREADS * ROUNDS * 5) ? 0 : 1;
}
