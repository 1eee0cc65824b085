/* Tests of the C ABI's edges: NULL handles and out-params, invalid UTF-8, garbage JSON, a wrong
 * "v", an unknown tool, a handle after a caught panic, an approver that answers garbage, and the
 * version macros against correx_abi_version(). Prints "N passed, M failed". */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "correx.h"
#include "minijson.h"
#include "rmtree.h"

static int passed, failed;

#define EXPECT(cond)                                                                  \
    do {                                                                              \
        if (cond) {                                                                   \
            passed++;                                                                 \
        } else {                                                                      \
            failed++;                                                                 \
            fprintf(stderr, "FAILED %s:%d: %s\n", __FILE__, __LINE__, #cond);          \
        }                                                                             \
    } while (0)

/* Runs a call that must fail with `code`, checking the error object too. */
#define EXPECT_CODE(code, call)                                                       \
    do {                                                                              \
        correx_error *err = NULL;                                                     \
        int32_t rc_ = (call);                                                         \
        EXPECT(rc_ == (code));                                                        \
        EXPECT(err != NULL && correx_error_code(err) == (code));                      \
        EXPECT(err != NULL && strlen(correx_error_message(err)) > 0);                 \
        if (rc_ != (code)) fprintf(stderr, "  got %d: %s\n", rc_, correx_error_message(err)); \
        correx_error_free(err);                                                       \
    } while (0)

static int32_t garbage_approver(void *ud, const char *tool, int32_t tier, const char *req) {
    (void)tool;
    (void)tier;
    (void)req;
    ++*(int *)ud;
    return 42; /* neither CORREX_APPROVE nor CORREX_DENY: must deny */
}

static int freed;
static void free_counter(void *ud) {
    (void)ud;
    freed++;
}

static int result_status_is(const char *json, const char *status) {
    char s[32] = "";
    mj_str(mj_get(json, "status"), s, sizeof s);
    return strcmp(s, status) == 0;
}

int main(void) {
    char dir[] = "/tmp/correx-ffi-XXXXXX";
    char config[1024];
    correx_runtime *rt = NULL, *untouched = (correx_runtime *)0x1;
    char *out = NULL;
    uint64_t n = 0;
    int asked = 0;
    const char bad_utf8[] = {'{', '"', (char)0xff, '"', '}', 0};

    /* Version macros agree with the library. */
    EXPECT(correx_abi_version() == CORREX_ABI_VERSION);
    EXPECT(((correx_abi_version() >> 16) & 0xff) == CORREX_ABI_VERSION_MAJOR);
    EXPECT(((correx_abi_version() >> 8) & 0xff) == CORREX_ABI_VERSION_MINOR);
    EXPECT((correx_abi_version() & 0xff) == CORREX_ABI_VERSION_PATCH);

    /* Frees of NULL are no-ops; NULL errors read safely. */
    correx_runtime_free(NULL);
    correx_error_free(NULL);
    correx_string_free(NULL);
    correx_cancel_free(NULL);
    correx_cancel_trigger(NULL);
    EXPECT(correx_error_code(NULL) == CORREX_E_NULL);
    EXPECT(strcmp(correx_error_message(NULL), "") == 0);

    /* Constructors: bad input leaves the out-param untouched. */
    EXPECT_CODE(CORREX_E_NULL, correx_runtime_new(NULL, &untouched, &err));
    EXPECT_CODE(CORREX_E_NULL, correx_runtime_new("{}", NULL, &err));
    EXPECT_CODE(CORREX_E_INVALID_ARGUMENT, correx_runtime_new(bad_utf8, &untouched, &err));
    EXPECT_CODE(CORREX_E_CONFIG, correx_runtime_new("{not json", &untouched, &err));
    EXPECT_CODE(CORREX_E_CONFIG, correx_runtime_new("{\"v\": 2, \"event_log\": \"/tmp/x.db\"}", &untouched, &err));
    EXPECT_CODE(CORREX_E_CONFIG, correx_runtime_new("{\"v\": 1, \"event_log\": \"/tmp/x.db\", \"tools\": {\"shell\": {\"enabled\": \"yes\"}}}", &untouched, &err));
    EXPECT(untouched == (correx_runtime *)0x1);
    /* A status without an error out-param works too. */
    EXPECT(correx_runtime_new(NULL, &untouched, NULL) == CORREX_E_NULL);

    if (!mkdtemp(dir)) return 1;
    snprintf(config, sizeof config,
             "{\"v\": 1, \"event_log\": \"%s/events.db\", \"sandbox_root\": \"%s/sb\", \"tools\": {"
             "\"file_write\": {\"enabled\": true, \"allowed_paths\": [\"%s\"]}}}",
             dir, dir, dir);
    {
        correx_error *err = NULL;
        int32_t rc = correx_runtime_new(config, &rt, &err);
        EXPECT(rc == CORREX_OK && rt != NULL && err == NULL);
        if (rc != CORREX_OK) {
            fprintf(stderr, "runtime: %s\n", correx_error_message(err));
            return 1;
        }
    }

    /* NULL handles and out-params. */
    EXPECT_CODE(CORREX_E_NULL, correx_events_last_position(NULL, &n, &err));
    EXPECT_CODE(CORREX_E_NULL, correx_events_last_position(rt, NULL, &err));
    EXPECT_CODE(CORREX_E_NULL, correx_tool_execute(rt, NULL, &out, &err));
    EXPECT_CODE(CORREX_E_NULL, correx_events_read_all(rt, 1, 10, NULL, &err));

    /* Strings and JSON. */
    EXPECT_CODE(CORREX_E_INVALID_ARGUMENT, correx_events_append(rt, bad_utf8, CORREX_EXPECT_ANY, 0, "{\"v\":1,\"events\":[{\"type_id\":\"x\"}]}", NULL, &err));
    EXPECT_CODE(CORREX_E_INVALID_ARGUMENT, correx_events_append(rt, "s", CORREX_EXPECT_ANY, 0, "garbage", NULL, &err));
    EXPECT_CODE(CORREX_E_INVALID_ARGUMENT, correx_events_append(rt, "s", CORREX_EXPECT_ANY, 0, "{\"v\":2,\"events\":[]}", NULL, &err));
    EXPECT_CODE(CORREX_E_INVALID_ARGUMENT, correx_events_append(rt, "s", CORREX_EXPECT_ANY, 0, "{\"events\":[]}", NULL, &err));
    EXPECT_CODE(CORREX_E_INVALID_ARGUMENT, correx_events_append(rt, "s", 99, 0, "{\"v\":1,\"events\":[{\"type_id\":\"x\"}]}", NULL, &err));
    EXPECT_CODE(CORREX_E_INVALID_ARGUMENT, correx_events_append(rt, "s", CORREX_EXPECT_ANY, 0, "{\"v\":1,\"events\":[]}", NULL, &err));
    EXPECT_CODE(CORREX_E_INVALID_ARGUMENT, correx_tool_execute(rt, "{\"v\":1,\"tool_name\":\"x\"}", &out, &err));
    EXPECT_CODE(CORREX_E_INVALID_ARGUMENT, correx_infer(rt, "m", "[1,2]", NULL, &out, &err));
    EXPECT_CODE(CORREX_E_UNKNOWN_MODEL, correx_infer(rt, "never-loaded", "{\"v\":1}", NULL, &out, &err));
    EXPECT_CODE(CORREX_E_NULL, correx_infer_stream(rt, "m", "{\"v\":1}", NULL, NULL, NULL, NULL, &err));
    EXPECT_CODE(CORREX_E_INVALID_ARGUMENT, correx_infer_stream(rt, "m", "{\"v\":1,\"config\":{\"tool_choice\":\"sometimes\"}}", NULL, NULL, NULL, &out, &err));
    EXPECT_CODE(CORREX_E_UNKNOWN_MODEL, correx_infer_stream(rt, "never-loaded", "{\"v\":1}", NULL, NULL, NULL, &out, &err));
    EXPECT_CODE(CORREX_E_INVALID_ARGUMENT, correx_model_load(rt, "{\"v\":1,\"model_id\":\"m\",\"residency\":\"sometimes\",\"model_path\":\"/x\"}", NULL, &err));
    EXPECT_CODE(CORREX_E_MODEL, correx_model_load(rt, "{\"v\":1,\"model_id\":\"m\",\"residency\":\"persistent\",\"model_path\":\"/nonexistent.gguf\"}", NULL, &err));

    /* An unknown tool is a failure result, not an ABI error. */
    {
        correx_error *err = NULL;
        EXPECT(correx_tool_execute(rt, "{\"v\":1,\"session_id\":\"s\",\"tool_name\":\"nope\"}", &out, &err) == CORREX_OK);
        EXPECT(result_status_is(out, "failure"));
        correx_string_free(out);
    }

    /* No approver registered: T2 denied. An approver answering garbage: denied. */
    {
        correx_error *err = NULL;
        const char *write = "{\"v\":1,\"session_id\":\"s\",\"tool_name\":\"file_write\",\"parameters\":{\"operation\":\"write\",\"path\":\"f.txt\",\"content\":\"x\"}}";
        EXPECT(correx_tool_execute(rt, write, &out, &err) == CORREX_OK);
        EXPECT(result_status_is(out, "failure"));
        correx_string_free(out);
        EXPECT(correx_runtime_set_approver(rt, garbage_approver, &asked, free_counter, &err) == CORREX_OK);
        EXPECT(correx_tool_execute(rt, write, &out, &err) == CORREX_OK);
        EXPECT(result_status_is(out, "failure"));
        EXPECT(asked == 1);
        correx_string_free(out);
        /* Replacing the approver frees the old user_data exactly once. */
        EXPECT(correx_runtime_set_approver(rt, NULL, NULL, NULL, &err) == CORREX_OK);
        EXPECT(freed == 1);
    }

    /* Count tokens without a server: approximated, never an error. */
    {
        correx_error *err = NULL;
        EXPECT(correx_count_tokens(rt, "abcdefgh", &n, &err) == CORREX_OK && n == 2);
    }

    /* A caught panic leaves the handle unusable; freeing still works. */
    EXPECT_CODE(CORREX_E_PANIC, correx_debug_panic(rt, &err));
    EXPECT_CODE(CORREX_E_UNUSABLE, correx_events_last_position(rt, &n, &err));
    EXPECT_CODE(CORREX_E_UNUSABLE, correx_tool_execute(rt, "{\"v\":1,\"session_id\":\"s\",\"tool_name\":\"nope\"}", &out, &err));
    correx_runtime_free(rt);
    rmtree(dir);

    printf("%d passed, %d failed\n", passed, failed);
    return failed == 0 ? 0 : 1;
}
