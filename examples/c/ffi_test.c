/* Tests of the C ABI's edges: NULL handles and out-params, invalid UTF-8, garbage JSON, a wrong
 * "v", unknown and missing fields, NUL bytes in config strings, huge inputs that must not come
 * back whole, an unknown tool, the tool list, tokenizing with no model, a handle after a caught
 * panic, an approver that answers garbage, and the version macros against
 * correx_abi_version(). Prints "N passed, M failed". */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

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
    /* The MCP handler's answer calls outside a handler: NULL answers. */
    EXPECT_CODE(CORREX_E_NULL, correx_runtime_set_mcp_handler(NULL, CORREX_MCP_SAMPLING, NULL, NULL, NULL, &err));
    EXPECT_CODE(CORREX_E_NULL, correx_mcp_answer_set(NULL, "{}", &err));
    EXPECT_CODE(CORREX_E_NULL, correx_mcp_answer_refuse(NULL, "no", &err));
    EXPECT(correx_mcp_answer_cancelled(NULL) == 0);

    /* Constructors: bad input leaves the out-param untouched. */
    EXPECT_CODE(CORREX_E_NULL, correx_runtime_new(NULL, &untouched, &err));
    EXPECT_CODE(CORREX_E_NULL, correx_runtime_new("{}", NULL, &err));
    EXPECT_CODE(CORREX_E_INVALID_ARGUMENT, correx_runtime_new(bad_utf8, &untouched, &err));
    EXPECT_CODE(CORREX_E_CONFIG, correx_runtime_new("{not json", &untouched, &err));
    EXPECT_CODE(CORREX_E_CONFIG, correx_runtime_new("{\"v\": 2, \"event_log\": \"/tmp/x.db\"}", &untouched, &err));
    EXPECT_CODE(CORREX_E_CONFIG, correx_runtime_new("{\"v\": 1, \"event_log\": \"/tmp/x.db\", \"tools\": {\"shell\": {\"enabled\": \"yes\"}}}", &untouched, &err));
    /* Config strings that will become C strings are checked when the runtime opens. */
    EXPECT_CODE(CORREX_E_CONFIG, correx_runtime_new("{\"v\": 1, \"event_log\": \"/tmp/x.db\", \"tools\": {\"shell\": {\"enabled\": true, \"allowed_executables\": [\"ls\"], \"env\": {\"A\": \"x\\u0000y\"}}}}", &untouched, &err));
    EXPECT_CODE(CORREX_E_CONFIG, correx_runtime_new("{\"v\": 1, \"event_log\": \"/tmp/x.db\", \"models\": {\"server_bin\": \"/bin/llama\\u0000x\"}}", &untouched, &err));
    EXPECT_CODE(CORREX_E_CONFIG, correx_runtime_new("{\"v\": 1, \"event_log\": \"/tmp/x.db\", \"models\": {\"log_dir\": \"/tmp/\\u0000\"}}", &untouched, &err));
    /* A huge input does not come back whole in the message. */
    {
        size_t big = 1 << 20;
        char *huge = malloc(big + 200);
        if (!huge) return 1;
        int at = snprintf(huge, 200, "{\"v\": 1, \"event_log\": \"/tmp/x.db\", \"tools\": {\"file_read\": {\"enabled\": true, \"allowed_paths\": [\"");
        memset(huge + at, 'a', big);
        strcpy(huge + at + big, "\"]}}}");
        correx_error *e = NULL;
        EXPECT(correx_runtime_new(huge, &untouched, &e) == CORREX_E_CONFIG);
        EXPECT(e != NULL && strlen(correx_error_message(e)) <= 4096);
        correx_error_free(e);
        free(huge);
    }
    EXPECT(untouched == (correx_runtime *)0x1);
    /* A status without an error out-param works too. */
    EXPECT(correx_runtime_new(NULL, &untouched, NULL) == CORREX_E_NULL);

    if (!mkdtemp(dir)) return 1;
    /* A plain listener on the model port: nothing may be sent to it while no model is loaded. */
    int listener = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    struct sockaddr_in addr = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t addr_len = sizeof addr;
    if (listener < 0 || bind(listener, (struct sockaddr *)&addr, sizeof addr) != 0 ||
        listen(listener, 4) != 0 || getsockname(listener, (struct sockaddr *)&addr, &addr_len) != 0)
        return 1;
    int model_port = ntohs(addr.sin_port);
    snprintf(config, sizeof config,
             "{\"v\": 1, \"event_log\": \"%s/events.db\", \"sandbox_root\": \"%s/sb\", \"tools\": {"
             "\"file_write\": {\"enabled\": true, \"allowed_paths\": [\"%s\"]}},"
             " \"models\": {\"port\": %d}}",
             dir, dir, dir, model_port);
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
    EXPECT_CODE(CORREX_E_UNKNOWN_MODEL, correx_infer(rt, "never-loaded", "{\"v\":1,\"context\":{}}", NULL, &out, &err));
    EXPECT_CODE(CORREX_E_NULL, correx_infer_stream(rt, "m", "{\"v\":1,\"context\":{}}", NULL, NULL, NULL, NULL, &err));
    EXPECT_CODE(CORREX_E_INVALID_ARGUMENT, correx_infer_stream(rt, "m", "{\"v\":1,\"context\":{},\"config\":{\"tool_choice\":\"sometimes\"}}", NULL, NULL, NULL, &out, &err));
    EXPECT_CODE(CORREX_E_UNKNOWN_MODEL, correx_infer_stream(rt, "never-loaded", "{\"v\":1,\"context\":{}}", NULL, NULL, NULL, &out, &err));
    /* Every payload refuses unknown fields and names missing ones. */
    {
        correx_error *e = NULL;
        EXPECT(correx_infer(rt, "m", "{\"v\":1}", NULL, &out, &e) == CORREX_E_INVALID_ARGUMENT);
        EXPECT(e != NULL && strstr(correx_error_message(e), "context") != NULL);
        correx_error_free(e);
    }
    EXPECT_CODE(CORREX_E_INVALID_ARGUMENT, correx_infer(rt, "m", "{\"v\":1,\"context\":{},\"config\":{\"temprature\":0}}", NULL, &out, &err));
    EXPECT_CODE(CORREX_E_INVALID_ARGUMENT, correx_infer(rt, "m", "{\"v\":1,\"context\":{\"task\":\"x\",\"sytem\":\"y\"}}", NULL, &out, &err));
    EXPECT_CODE(CORREX_E_INVALID_ARGUMENT, correx_model_load(rt, "{\"v\":1,\"model_id\":\"m\",\"residency\":\"persistent\",\"model_path\":\"/x\",\"ctx\":4}", NULL, &err));
    EXPECT_CODE(CORREX_E_INVALID_ARGUMENT, correx_model_load(rt, "{\"v\":1,\"model_path\":\"/x\",\"residency\":\"persistent\"}", NULL, &err));
    EXPECT_CODE(CORREX_E_INVALID_ARGUMENT, correx_events_append(rt, "s", CORREX_EXPECT_ANY, 0, "{\"v\":1,\"events\":[{\"type_id\":\"\"}]}", NULL, &err));
    EXPECT_CODE(CORREX_E_INVALID_ARGUMENT, correx_events_append(rt, "s", CORREX_EXPECT_ANY, 0, "{\"v\":1,\"events\":[{\"type_id\":\"x\",\"paylod\":{}}]}", NULL, &err));
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

    /* With no model loaded, tokenizing sends nothing, even with a listener on the model port:
     * tokenize fails with CORREX_E_MODEL, counting approximates. */
    {
        correx_error *err = NULL;
        EXPECT_CODE(CORREX_E_MODEL, correx_tokenize(rt, "abcdefgh", &out, &err));
        EXPECT(correx_count_tokens(rt, "abcdefgh", &n, &err) == CORREX_OK && n == 2);
        int fd = accept(listener, NULL, NULL);
        EXPECT(fd < 0 && (errno == EAGAIN || errno == EWOULDBLOCK));
        if (fd >= 0) close(fd);
    }

    /* The tool list: the enabled file_write and the disabled built-ins, with their schemas. */
    {
        correx_error *err = NULL;
        EXPECT(correx_tools_list(rt, &out, &err) == CORREX_OK);
        const char *fw = strstr(out, "\"name\":\"file_write\"");
        const char *sh = strstr(out, "\"name\":\"shell\"");
        EXPECT(fw != NULL && sh != NULL && strstr(out, "\"operations\":[\"write\",\"delete\"]") != NULL);
        EXPECT(strstr(out, "\"enabled\":true") != NULL && strstr(out, "\"enabled\":false") != NULL);
        correx_string_free(out);
        EXPECT_CODE(CORREX_E_NULL, correx_tools_list(rt, NULL, &err));
        EXPECT(correx_models_status(rt, &out, &err) == CORREX_OK && strstr(out, "\"models\":[]") != NULL);
        correx_string_free(out);
        EXPECT_CODE(CORREX_E_NULL, correx_models_status(rt, NULL, &err));
    }

    /* A tool failure that quotes a huge path is cut. */
    {
        correx_error *err = NULL;
        size_t big = 1 << 20;
        char *req = malloc(big + 300);
        if (!req) return 1;
        int at = snprintf(req, 300, "{\"v\":1,\"session_id\":\"s\",\"tool_name\":\"file_write\",\"parameters\":{\"operation\":\"write\",\"content\":\"x\",\"path\":\"/");
        memset(req + at, 'p', big);
        strcpy(req + at + big, "\"}}");
        EXPECT(correx_tool_execute(rt, req, &out, &err) == CORREX_OK);
        EXPECT(result_status_is(out, "failure") && strlen(out) < 8192);
        correx_string_free(out);
        free(req);
    }

    /* The panic guard is tested from Rust (tests/ffi.rs): the hook that panics inside correx
     * is only in a library built for tests. */
    correx_runtime_free(rt);
    rmtree(dir);
    close(listener);

    printf("%d passed, %d failed\n", passed, failed);
    return failed == 0 ? 0 : 1;
}
