/*
 * JNI glue between dev.correx.Native and the C ABI in include/correx.h.
 *
 * Hand-written C over the settled C ABI rather than Rust with the `jni` crate: the JVM then
 * reaches correx through exactly the calls C and C++ hosts use (so every Java test is also a
 * test of that ABI), no crate is added to the library's build, and the glue needs nothing but
 * the JDK's own jni.h.
 *
 * Conventions:
 * - Strings cross as byte[] of UTF-8, both ways (JNI's own "modified UTF-8" differs for NUL and
 *   for characters outside the BMP). Java checks for NUL bytes before calling in.
 * - Handles are jlong casts of correx pointers. Java keeps them live for the duration of each
 *   call (see dev.correx.Handle); a 0 handle becomes NULL and correx answers CORREX_E_NULL.
 * - A failure throws dev.correx.CorrexException.of(code, message) and returns a zero value.
 * - The library is linked -z nodelete: correx's log sink and the thread-exit destructor point
 *   into it, so it must stay mapped even if its class loader is collected.
 * - Callbacks (approver, stream chunks, log) call a Java bridge object whose methods never throw
 *   (they catch everything and answer deny / stop). A callback arriving on a thread the JVM does
 *   not know (correx's own threads) attaches it as a daemon once; a thread-exit destructor
 *   detaches it.
 */
#include <jni.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "correx.h"

static JavaVM *g_vm;
static jclass g_exception;        /* dev.correx.CorrexException */
static jmethodID g_exception_of;  /* static CorrexException of(int, byte[]) */
static jmethodID g_approve;       /* int ApproverBridge.approve(byte[] tool, int tier, byte[] json) */
static jmethodID g_mcp_answer;    /* byte[] McpBridge.answer(byte[] server, byte[] method, byte[] params, long answer) */
static jmethodID g_chunk;         /* boolean ChunkBridge.chunk(int kind, byte[] text) */
static jmethodID g_log;           /* void LogBridge.log(int level, byte[] message) */
static pthread_key_t g_detach_key;
static jobject g_log_bridge;      /* global ref, or NULL */
static pthread_mutex_t g_log_lock = PTHREAD_MUTEX_INITIALIZER;
/* Serializes setLogger as a whole. Not g_log_lock: log_cb takes that inside correx's log sink,
 * whose own lock correx_set_log_callback takes, so holding both here would invert the order. */
static pthread_mutex_t g_set_logger_lock = PTHREAD_MUTEX_INITIALIZER;

static void detach_thread(void *unused) {
    (void)unused;
    if (g_vm != NULL) {
        (*g_vm)->DetachCurrentThread(g_vm);
    }
}

/* The JNIEnv of this thread, attaching it (as a daemon, detached at thread exit) when the JVM
 * does not know it. NULL when the JVM cannot attach it. */
static JNIEnv *env_for_callback(void) {
    JNIEnv *env = NULL;
    jint rc = (*g_vm)->GetEnv(g_vm, (void **)&env, JNI_VERSION_1_8);
    if (rc == JNI_OK) {
        return env;
    }
    if (rc != JNI_EDETACHED) {
        return NULL;
    }
    JavaVMAttachArgs args = {JNI_VERSION_1_8, "correx-native", NULL};
    if ((*g_vm)->AttachCurrentThreadAsDaemon(g_vm, (void **)&env, &args) != JNI_OK) {
        return NULL;
    }
    pthread_setspecific(g_detach_key, (void *)1);
    return env;
}

static jbyteArray bytes_of(JNIEnv *env, const char *s, size_t len) {
    jbyteArray out = (*env)->NewByteArray(env, (jsize)len);
    if (out != NULL && len > 0) {
        (*env)->SetByteArrayRegion(env, out, 0, (jsize)len, (const jbyte *)s);
    }
    return out;
}

/* A NUL-terminated copy of a byte[] (NULL for a null array); free with free(). On allocation
 * failure an OutOfMemoryError is pending and *failed is set. */
static char *cstr_of(JNIEnv *env, jbyteArray bytes, int *failed) {
    if (bytes == NULL) {
        return NULL;
    }
    jsize n = (*env)->GetArrayLength(env, bytes);
    char *s = malloc((size_t)n + 1);
    if (s == NULL) {
        jclass oom = (*env)->FindClass(env, "java/lang/OutOfMemoryError");
        if (oom != NULL) {
            (*env)->ThrowNew(env, oom, "correx: copying a string");
        }
        *failed = 1;
        return NULL;
    }
    (*env)->GetByteArrayRegion(env, bytes, 0, n, (jbyte *)s);
    s[n] = '\0';
    return s;
}

static void throw_error(JNIEnv *env, int32_t code, correx_error *err) {
    const char *msg = correx_error_message(err);
    jbyteArray m = bytes_of(env, msg, strlen(msg));
    correx_error_free(err);
    if (m == NULL) {
        return; /* OutOfMemoryError pending */
    }
    jobject ex = (*env)->CallStaticObjectMethod(env, g_exception, g_exception_of, code, m);
    if (ex != NULL && !(*env)->ExceptionCheck(env)) {
        (*env)->Throw(env, (jthrowable)ex);
    }
}

/* Throws for a failed status; returns 1 when it did. */
static int failed(JNIEnv *env, int32_t rc, correx_error *err) {
    if (rc == CORREX_OK) {
        correx_error_free(err);
        return 0;
    }
    throw_error(env, rc, err);
    return 1;
}

/* A correx string as byte[] (NULL stays NULL), freeing it. */
static jbyteArray take_string(JNIEnv *env, char *s) {
    if (s == NULL) {
        return NULL;
    }
    jbyteArray out = bytes_of(env, s, strlen(s));
    correx_string_free(s);
    return out;
}

/* A call's string result: thrown for a failed status (its out-param is then untouched), else
 * the string as byte[], freed. */
static jbyteArray answer(JNIEnv *env, int32_t rc, correx_error *err, char *out) {
    if (failed(env, rc, err)) {
        return NULL;
    }
    return take_string(env, out);
}

#define RT(h) ((const correx_runtime *)(intptr_t)(h))
#define CANCEL(h) ((const correx_cancel *)(intptr_t)(h))
#define SUB(h) ((const correx_subscription *)(intptr_t)(h))

/* Declares `char *name` from the byte[] `arr`, returning `ret` if the copy failed. */
#define IN(name, arr, ret)                  \
    int name##_failed = 0;                  \
    char *name = cstr_of(env, arr, &name##_failed); \
    if (name##_failed) return ret

JNIEXPORT jint JNICALL JNI_OnLoad(JavaVM *vm, void *reserved) {
    (void)reserved;
    g_vm = vm;
    JNIEnv *env = NULL;
    if ((*vm)->GetEnv(vm, (void **)&env, JNI_VERSION_1_8) != JNI_OK) {
        return JNI_ERR;
    }
    if (pthread_key_create(&g_detach_key, detach_thread) != 0) {
        return JNI_ERR;
    }
    jclass ex = (*env)->FindClass(env, "dev/correx/CorrexException");
    jclass ab = (*env)->FindClass(env, "dev/correx/Native$ApproverBridge");
    jclass cb = (*env)->FindClass(env, "dev/correx/Native$ChunkBridge");
    jclass lb = (*env)->FindClass(env, "dev/correx/Native$LogBridge");
    jclass mb = (*env)->FindClass(env, "dev/correx/Native$McpBridge");
    if (ex == NULL || ab == NULL || cb == NULL || lb == NULL || mb == NULL) {
        return JNI_ERR;
    }
    g_exception = (jclass)(*env)->NewGlobalRef(env, ex);
    g_exception_of = (*env)->GetStaticMethodID(env, ex, "of", "(I[B)Ldev/correx/CorrexException;");
    g_approve = (*env)->GetMethodID(env, ab, "approve", "([BI[B)I");
    g_chunk = (*env)->GetMethodID(env, cb, "chunk", "(I[B)Z");
    g_log = (*env)->GetMethodID(env, lb, "log", "(I[B)V");
    g_mcp_answer = (*env)->GetMethodID(env, mb, "answer", "([B[B[BJ)[B");
    if (g_exception == NULL || g_exception_of == NULL || g_approve == NULL || g_chunk == NULL ||
        g_log == NULL || g_mcp_answer == NULL) {
        return JNI_ERR;
    }
    return JNI_VERSION_1_8;
}

JNIEXPORT jint JNICALL Java_dev_correx_Native_abiVersion(JNIEnv *env, jclass cls) {
    (void)env;
    (void)cls;
    return correx_abi_version();
}

/* ---- runtime ---- */

JNIEXPORT jlong JNICALL Java_dev_correx_Native_runtimeNew(JNIEnv *env, jclass cls, jbyteArray config) {
    (void)cls;
    IN(c, config, 0);
    correx_runtime *rt = NULL;
    correx_error *err = NULL;
    int32_t rc = correx_runtime_new(c, &rt, &err);
    free(c);
    if (failed(env, rc, err)) {
        return 0;
    }
    return (jlong)(intptr_t)rt;
}

JNIEXPORT void JNICALL Java_dev_correx_Native_runtimeFree(JNIEnv *env, jclass cls, jlong rt) {
    (void)env;
    (void)cls;
    correx_runtime_free((correx_runtime *)(intptr_t)rt);
}

/* ---- approver ---- */

struct approver {
    jobject bridge; /* global ref */
};

static int32_t approve_cb(void *user_data, const char *tool, int32_t tier, const char *request_json) {
    struct approver *a = user_data;
    JNIEnv *env = env_for_callback();
    if (env == NULL) {
        return CORREX_DENY;
    }
    if ((*env)->PushLocalFrame(env, 4) != 0) {
        (*env)->ExceptionClear(env);
        return CORREX_DENY;
    }
    jbyteArray t = bytes_of(env, tool, strlen(tool));
    jbyteArray j = t == NULL ? NULL : bytes_of(env, request_json, strlen(request_json));
    jint answer = CORREX_DENY;
    if (j != NULL) {
        answer = (*env)->CallIntMethod(env, a->bridge, g_approve, t, (jint)tier, j);
    }
    if ((*env)->ExceptionCheck(env)) {
        /* The bridge catches everything; an Error escaping it (out of memory) denies. */
        (*env)->ExceptionClear(env);
        answer = CORREX_DENY;
    }
    (*env)->PopLocalFrame(env, NULL);
    return answer;
}

static void approver_free(void *user_data) {
    struct approver *a = user_data;
    JNIEnv *env = env_for_callback();
    if (env != NULL) {
        (*env)->DeleteGlobalRef(env, a->bridge);
    }
    free(a);
}

JNIEXPORT void JNICALL Java_dev_correx_Native_setApprover(JNIEnv *env, jclass cls, jlong rt,
                                                         jobject bridge) {
    (void)cls;
    correx_error *err = NULL;
    if (bridge == NULL) {
        failed(env, correx_runtime_set_approver(RT(rt), NULL, NULL, NULL, &err), err);
        return;
    }
    struct approver *a = malloc(sizeof *a);
    if (a == NULL) {
        jclass oom = (*env)->FindClass(env, "java/lang/OutOfMemoryError");
        if (oom != NULL) {
            (*env)->ThrowNew(env, oom, "correx: approver");
        }
        return;
    }
    a->bridge = (*env)->NewGlobalRef(env, bridge);
    if (a->bridge == NULL) {
        free(a); /* OutOfMemoryError pending */
        return;
    }
    int32_t rc = correx_runtime_set_approver(RT(rt), approve_cb, a, approver_free, &err);
    if (rc != CORREX_OK) {
        /* Not registered: the destructor will not run, so release here. */
        (*env)->DeleteGlobalRef(env, a->bridge);
        free(a);
    }
    failed(env, rc, err);
}

/* ---- MCP servers' requests to the host ---- */

struct mcp_handler {
    jobject bridge; /* global ref */
};

static int32_t mcp_cb(void *user_data, const char *server, const char *method, const char *params,
                      correx_mcp_answer *answer) {
    struct mcp_handler *h = user_data;
    JNIEnv *env = env_for_callback();
    if (env == NULL) {
        return 1;
    }
    if ((*env)->PushLocalFrame(env, 8) != 0) {
        (*env)->ExceptionClear(env);
        return 1;
    }
    int32_t rc = 1;
    jbyteArray s = bytes_of(env, server, strlen(server));
    jbyteArray m = s == NULL ? NULL : bytes_of(env, method, strlen(method));
    jbyteArray p = m == NULL ? NULL : bytes_of(env, params, strlen(params));
    jbyteArray out = NULL;
    if (p != NULL) {
        out = (jbyteArray)(*env)->CallObjectMethod(env, h->bridge, g_mcp_answer, s, m, p,
                                                   (jlong)(intptr_t)answer);
    }
    if ((*env)->ExceptionCheck(env)) {
        /* The bridge catches everything; an Error escaping it (out of memory) declines. */
        (*env)->ExceptionClear(env);
        out = NULL;
    }
    if (out != NULL) {
        int copy_failed = 0;
        char *json = cstr_of(env, out, &copy_failed);
        if (!copy_failed) {
            rc = correx_mcp_answer_set(answer, json, NULL);
            free(json);
        } else {
            (*env)->ExceptionClear(env);
        }
    }
    (*env)->PopLocalFrame(env, NULL);
    return rc;
}

static void mcp_handler_free(void *user_data) {
    struct mcp_handler *h = user_data;
    JNIEnv *env = env_for_callback();
    if (env != NULL) {
        (*env)->DeleteGlobalRef(env, h->bridge);
    }
    free(h);
}

JNIEXPORT void JNICALL Java_dev_correx_Native_setMcpHandler(JNIEnv *env, jclass cls, jlong rt,
                                                           jint methods, jobject bridge) {
    (void)cls;
    correx_error *err = NULL;
    if (bridge == NULL) {
        failed(env, correx_runtime_set_mcp_handler(RT(rt), 0, NULL, NULL, NULL, &err), err);
        return;
    }
    struct mcp_handler *h = malloc(sizeof *h);
    if (h == NULL) {
        jclass oom = (*env)->FindClass(env, "java/lang/OutOfMemoryError");
        if (oom != NULL) {
            (*env)->ThrowNew(env, oom, "correx: mcp handler");
        }
        return;
    }
    h->bridge = (*env)->NewGlobalRef(env, bridge);
    if (h->bridge == NULL) {
        free(h); /* OutOfMemoryError pending */
        return;
    }
    int32_t rc = correx_runtime_set_mcp_handler(RT(rt), methods, mcp_cb, h, mcp_handler_free, &err);
    if (rc != CORREX_OK) {
        /* Not registered: the destructor will not run, so release here. */
        (*env)->DeleteGlobalRef(env, h->bridge);
        free(h);
    }
    failed(env, rc, err);
}

JNIEXPORT jboolean JNICALL Java_dev_correx_Native_mcpAnswerCancelled(JNIEnv *env, jclass cls,
                                                                    jlong answer) {
    (void)env;
    (void)cls;
    return correx_mcp_answer_cancelled((const correx_mcp_answer *)(intptr_t)answer) ? JNI_TRUE : JNI_FALSE;
}

/* ---- events ---- */

JNIEXPORT jbyteArray JNICALL Java_dev_correx_Native_eventsAppend(JNIEnv *env, jclass cls, jlong rt,
                                                                jbyteArray stream, jint kind,
                                                                jlong version, jbyteArray events) {
    (void)cls;
    IN(s, stream, NULL);
    IN(e, events, (free(s), NULL));
    char *out = NULL;
    correx_error *err = NULL;
    int32_t rc = correx_events_append(RT(rt), s, kind, (uint64_t)version, e, &out, &err);
    free(s);
    free(e);
    return answer(env, rc, err, out);
}

JNIEXPORT jbyteArray JNICALL Java_dev_correx_Native_eventsReadStream(JNIEnv *env, jclass cls, jlong rt,
                                                                    jbyteArray stream, jlong from,
                                                                    jint max) {
    (void)cls;
    IN(s, stream, NULL);
    char *out = NULL;
    correx_error *err = NULL;
    int32_t rc = correx_events_read_stream(RT(rt), s, (uint64_t)from, (uint32_t)max, &out, &err);
    free(s);
    return answer(env, rc, err, out);
}

JNIEXPORT jbyteArray JNICALL Java_dev_correx_Native_eventsReadAll(JNIEnv *env, jclass cls, jlong rt,
                                                                 jlong from, jint max) {
    (void)cls;
    char *out = NULL;
    correx_error *err = NULL;
    int32_t rc = correx_events_read_all(RT(rt), (uint64_t)from, (uint32_t)max, &out, &err);
    return answer(env, rc, err, out);
}

JNIEXPORT jlong JNICALL Java_dev_correx_Native_eventsLastPosition(JNIEnv *env, jclass cls, jlong rt) {
    (void)cls;
    uint64_t pos = 0;
    correx_error *err = NULL;
    if (failed(env, correx_events_last_position(RT(rt), &pos, &err), err)) {
        return 0;
    }
    return (jlong)pos;
}

JNIEXPORT jlong JNICALL Java_dev_correx_Native_subscribe(JNIEnv *env, jclass cls, jlong rt, jlong after) {
    (void)cls;
    correx_subscription *sub = NULL;
    correx_error *err = NULL;
    if (failed(env, correx_subscribe(RT(rt), (uint64_t)after, &sub, &err), err)) {
        return 0;
    }
    return (jlong)(intptr_t)sub;
}

JNIEXPORT jbyteArray JNICALL Java_dev_correx_Native_subscriptionNext(JNIEnv *env, jclass cls, jlong sub,
                                                                    jint timeout_ms) {
    (void)cls;
    char *out = NULL;
    correx_error *err = NULL;
    int32_t rc = correx_subscription_next(SUB(sub), (uint32_t)timeout_ms, &out, &err);
    return answer(env, rc, err, out);
}

JNIEXPORT jlong JNICALL Java_dev_correx_Native_subscriptionPosition(JNIEnv *env, jclass cls, jlong sub) {
    (void)env;
    (void)cls;
    return (jlong)correx_subscription_position(SUB(sub));
}

JNIEXPORT void JNICALL Java_dev_correx_Native_subscriptionFree(JNIEnv *env, jclass cls, jlong sub) {
    (void)env;
    (void)cls;
    correx_subscription_free((correx_subscription *)(intptr_t)sub);
}

/* ---- cancellation ---- */

JNIEXPORT jlong JNICALL Java_dev_correx_Native_cancelNew(JNIEnv *env, jclass cls) {
    (void)cls;
    correx_cancel *c = NULL;
    correx_error *err = NULL;
    if (failed(env, correx_cancel_new(&c, &err), err)) {
        return 0;
    }
    return (jlong)(intptr_t)c;
}

JNIEXPORT void JNICALL Java_dev_correx_Native_cancelTrigger(JNIEnv *env, jclass cls, jlong c) {
    (void)env;
    (void)cls;
    correx_cancel_trigger(CANCEL(c));
}

JNIEXPORT void JNICALL Java_dev_correx_Native_cancelReset(JNIEnv *env, jclass cls, jlong c) {
    (void)env;
    (void)cls;
    correx_cancel_reset(CANCEL(c));
}

JNIEXPORT void JNICALL Java_dev_correx_Native_cancelFree(JNIEnv *env, jclass cls, jlong c) {
    (void)env;
    (void)cls;
    correx_cancel_free((correx_cancel *)(intptr_t)c);
}

/* ---- models ---- */

JNIEXPORT void JNICALL Java_dev_correx_Native_modelLoad(JNIEnv *env, jclass cls, jlong rt,
                                                       jbyteArray descriptor, jlong cancel) {
    (void)cls;
    IN(d, descriptor, );
    correx_error *err = NULL;
    int32_t rc = correx_model_load(RT(rt), d, CANCEL(cancel), &err);
    free(d);
    failed(env, rc, err);
}

JNIEXPORT void JNICALL Java_dev_correx_Native_modelUnload(JNIEnv *env, jclass cls, jlong rt,
                                                         jbyteArray model) {
    (void)cls;
    IN(m, model, );
    correx_error *err = NULL;
    int32_t rc = correx_model_unload(RT(rt), m, &err);
    free(m);
    failed(env, rc, err);
}

typedef int32_t (*json_query)(const correx_runtime *, char **, correx_error **);

static jbyteArray query(JNIEnv *env, jlong rt, json_query f) {
    char *out = NULL;
    correx_error *err = NULL;
    int32_t rc = f(RT(rt), &out, &err);
    return answer(env, rc, err, out);
}

JNIEXPORT jbyteArray JNICALL Java_dev_correx_Native_modelsStatus(JNIEnv *env, jclass cls, jlong rt) {
    (void)cls;
    return query(env, rt, correx_models_status);
}

JNIEXPORT jbyteArray JNICALL Java_dev_correx_Native_modelCurrent(JNIEnv *env, jclass cls, jlong rt) {
    (void)cls;
    return query(env, rt, correx_model_current);
}

JNIEXPORT jbyteArray JNICALL Java_dev_correx_Native_modelHealth(JNIEnv *env, jclass cls, jlong rt) {
    (void)cls;
    return query(env, rt, correx_model_health);
}

JNIEXPORT jbyteArray JNICALL Java_dev_correx_Native_toolsList(JNIEnv *env, jclass cls, jlong rt) {
    (void)cls;
    return query(env, rt, correx_tools_list);
}

JNIEXPORT jlong JNICALL Java_dev_correx_Native_countTokens(JNIEnv *env, jclass cls, jlong rt,
                                                          jbyteArray text) {
    (void)cls;
    IN(t, text, 0);
    uint64_t n = 0;
    correx_error *err = NULL;
    int32_t rc = correx_count_tokens(RT(rt), t, &n, &err);
    free(t);
    if (failed(env, rc, err)) {
        return 0;
    }
    return (jlong)n;
}

JNIEXPORT jbyteArray JNICALL Java_dev_correx_Native_tokenize(JNIEnv *env, jclass cls, jlong rt,
                                                            jbyteArray text) {
    (void)cls;
    IN(t, text, NULL);
    char *out = NULL;
    correx_error *err = NULL;
    int32_t rc = correx_tokenize(RT(rt), t, &out, &err);
    free(t);
    return answer(env, rc, err, out);
}

JNIEXPORT jbyteArray JNICALL Java_dev_correx_Native_infer(JNIEnv *env, jclass cls, jlong rt,
                                                         jbyteArray model, jbyteArray request,
                                                         jlong cancel) {
    (void)cls;
    IN(m, model, NULL);
    IN(r, request, (free(m), NULL));
    char *out = NULL;
    correx_error *err = NULL;
    int32_t rc = correx_infer(RT(rt), m, r, CANCEL(cancel), &out, &err);
    free(m);
    free(r);
    return answer(env, rc, err, out);
}

JNIEXPORT jbyteArray JNICALL Java_dev_correx_Native_embed(JNIEnv *env, jclass cls, jlong rt,
                                                         jbyteArray model, jbyteArray inputs,
                                                         jlong cancel) {
    (void)cls;
    IN(m, model, NULL);
    IN(i, inputs, (free(m), NULL));
    char *out = NULL;
    correx_error *err = NULL;
    int32_t rc = correx_embed(RT(rt), m, i, CANCEL(cancel), &out, &err);
    free(m);
    free(i);
    return answer(env, rc, err, out);
}

struct chunk_ctx {
    JNIEnv *env;
    jobject bridge;
};

static int32_t chunk_cb(void *user_data, int32_t kind, const char *text, size_t len) {
    struct chunk_ctx *c = user_data;
    JNIEnv *env = c->env; /* the calling thread's: chunks arrive on it */
    jbyteArray t = bytes_of(env, text, len);
    if (t == NULL) {
        (*env)->ExceptionClear(env);
        return 1;
    }
    jboolean go_on = (*env)->CallBooleanMethod(env, c->bridge, g_chunk, (jint)kind, t);
    (*env)->DeleteLocalRef(env, t);
    if ((*env)->ExceptionCheck(env)) {
        (*env)->ExceptionClear(env);
        return 1;
    }
    return go_on ? CORREX_CONTINUE : 1;
}

JNIEXPORT jbyteArray JNICALL Java_dev_correx_Native_inferStream(JNIEnv *env, jclass cls, jlong rt,
                                                               jbyteArray model, jbyteArray request,
                                                               jlong cancel, jobject bridge) {
    (void)cls;
    IN(m, model, NULL);
    IN(r, request, (free(m), NULL));
    struct chunk_ctx ctx = {env, bridge};
    char *out = NULL;
    correx_error *err = NULL;
    int32_t rc = correx_infer_stream(RT(rt), m, r, CANCEL(cancel), bridge == NULL ? NULL : chunk_cb,
                                     &ctx, &out, &err);
    free(m);
    free(r);
    return answer(env, rc, err, out);
}

/* ---- tools ---- */

JNIEXPORT jbyteArray JNICALL Java_dev_correx_Native_toolExecute(JNIEnv *env, jclass cls, jlong rt,
                                                               jbyteArray request, jlong cancel) {
    (void)cls;
    IN(r, request, NULL);
    char *out = NULL;
    correx_error *err = NULL;
    int32_t rc = correx_tool_execute_with_cancel(RT(rt), r, CANCEL(cancel), &out, &err);
    free(r);
    return answer(env, rc, err, out);
}

/* ---- jobs ---- */

JNIEXPORT jbyteArray JNICALL Java_dev_correx_Native_jobs(JNIEnv *env, jclass cls, jlong rt,
                                                        jbyteArray request, jlong cancel) {
    (void)cls;
    IN(r, request, NULL);
    char *out = NULL;
    correx_error *err = NULL;
    int32_t rc = correx_jobs(RT(rt), r, CANCEL(cancel), &out, &err);
    free(r);
    return answer(env, rc, err, out);
}

JNIEXPORT jbyteArray JNICALL Java_dev_correx_Native_sessionInfer(JNIEnv *env, jclass cls, jlong rt,
                                                                jbyteArray session, jbyteArray step,
                                                                jbyteArray model, jbyteArray request,
                                                                jlong cancel, jobject bridge) {
    (void)cls;
    IN(s, session, NULL);
    IN(k, step, (free(s), NULL));
    IN(m, model, (free(s), free(k), NULL));
    IN(r, request, (free(s), free(k), free(m), NULL));
    char *out = NULL;
    correx_error *err = NULL;
    struct chunk_ctx ctx = {env, bridge};
    int32_t rc = correx_session_infer(RT(rt), s, k, m, r, CANCEL(cancel),
                                      bridge == NULL ? NULL : chunk_cb, &ctx, &out, &err);
    free(s);
    free(k);
    free(m);
    free(r);
    return answer(env, rc, err, out);
}

JNIEXPORT jbyteArray JNICALL Java_dev_correx_Native_sessionExecute(JNIEnv *env, jclass cls, jlong rt,
                                                                  jbyteArray session, jbyteArray step,
                                                                  jbyteArray request, jlong cancel) {
    (void)cls;
    IN(s, session, NULL);
    IN(k, step, (free(s), NULL));
    IN(r, request, (free(s), free(k), NULL));
    char *out = NULL;
    correx_error *err = NULL;
    int32_t rc = correx_session_execute(RT(rt), s, k, r, CANCEL(cancel), &out, &err);
    free(s);
    free(k);
    free(r);
    return answer(env, rc, err, out);
}

JNIEXPORT jbyteArray JNICALL Java_dev_correx_Native_sessionWait(JNIEnv *env, jclass cls, jlong rt,
                                                               jbyteArray session, jbyteArray step,
                                                               jbyteArray wait, jlong cancel) {
    (void)cls;
    IN(s, session, NULL);
    IN(k, step, (free(s), NULL));
    IN(w, wait, (free(s), free(k), NULL));
    char *out = NULL;
    correx_error *err = NULL;
    int32_t rc = correx_session_wait(RT(rt), s, k, w, CANCEL(cancel), &out, &err);
    free(s);
    free(k);
    free(w);
    return answer(env, rc, err, out);
}

JNIEXPORT jbyteArray JNICALL Java_dev_correx_Native_sessionSignal(JNIEnv *env, jclass cls, jlong rt,
                                                                 jbyteArray session,
                                                                 jbyteArray signal) {
    (void)cls;
    IN(s, session, NULL);
    IN(g, signal, (free(s), NULL));
    char *out = NULL;
    correx_error *err = NULL;
    int32_t rc = correx_session_signal(RT(rt), s, g, &out, &err);
    free(s);
    free(g);
    return answer(env, rc, err, out);
}

JNIEXPORT jbyteArray JNICALL Java_dev_correx_Native_approvalsDecide(JNIEnv *env, jclass cls, jlong rt,
                                                                   jbyteArray session, jbyteArray request,
                                                                   jbyteArray decision) {
    (void)cls;
    IN(s, session, NULL);
    IN(q, request, (free(s), NULL));
    IN(d, decision, (free(s), free(q), NULL));
    char *out = NULL;
    correx_error *err = NULL;
    int32_t rc = correx_approvals_decide(RT(rt), s, q, d, &out, &err);
    free(s);
    free(q);
    free(d);
    return answer(env, rc, err, out);
}

JNIEXPORT jbyteArray JNICALL Java_dev_correx_Native_approvalsList(JNIEnv *env, jclass cls, jlong rt,
                                                                 jbyteArray session, jint all) {
    (void)cls;
    IN(s, session, NULL); /* a null session is NULL: every session */
    char *out = NULL;
    correx_error *err = NULL;
    int32_t rc = correx_approvals_list(RT(rt), s, (int32_t)all, &out, &err);
    free(s);
    return answer(env, rc, err, out);
}

JNIEXPORT jbyteArray JNICALL Java_dev_correx_Native_mcpPin(JNIEnv *env, jclass cls, jlong rt,
                                                         jbyteArray request) {
    (void)cls;
    IN(q, request, NULL);
    char *out = NULL;
    correx_error *err = NULL;
    int32_t rc = correx_mcp_pin(RT(rt), q, &out, &err);
    free(q);
    return answer(env, rc, err, out);
}

JNIEXPORT jbyteArray JNICALL Java_dev_correx_Native_sessionTranscript(JNIEnv *env, jclass cls,
                                                                     jlong rt, jbyteArray session) {
    (void)cls;
    IN(s, session, NULL);
    char *out = NULL;
    correx_error *err = NULL;
    int32_t rc = correx_session_transcript(RT(rt), s, &out, &err);
    free(s);
    return answer(env, rc, err, out);
}

JNIEXPORT jbyteArray JNICALL Java_dev_correx_Native_metrics(JNIEnv *env, jclass cls, jlong rt) {
    (void)cls;
    char *out = NULL;
    correx_error *err = NULL;
    int32_t rc = correx_metrics(RT(rt), &out, &err);
    return answer(env, rc, err, out);
}

JNIEXPORT void JNICALL Java_dev_correx_Native_sessionEnd(JNIEnv *env, jclass cls, jlong rt,
                                                        jbyteArray session) {
    (void)cls;
    IN(s, session, );
    correx_error *err = NULL;
    int32_t rc = correx_session_end(RT(rt), s, &err);
    free(s);
    failed(env, rc, err);
}

/* ---- log ---- */

static void log_cb(void *user_data, int32_t level, const char *message) {
    (void)user_data;
    JNIEnv *env = env_for_callback();
    /* A Java thread with an exception pending (its own) must not call Java: the record drops. */
    if (env == NULL || (*env)->ExceptionCheck(env)) {
        return;
    }
    pthread_mutex_lock(&g_log_lock);
    jobject bridge = g_log_bridge == NULL ? NULL : (*env)->NewLocalRef(env, g_log_bridge);
    pthread_mutex_unlock(&g_log_lock);
    if (bridge == NULL) {
        return;
    }
    jbyteArray m = bytes_of(env, message, strlen(message));
    if (m != NULL) {
        (*env)->CallVoidMethod(env, bridge, g_log, (jint)level, m);
        (*env)->DeleteLocalRef(env, m);
    }
    if ((*env)->ExceptionCheck(env)) {
        (*env)->ExceptionClear(env);
    }
    (*env)->DeleteLocalRef(env, bridge);
}

JNIEXPORT void JNICALL Java_dev_correx_Native_setLogger(JNIEnv *env, jclass cls, jobject bridge,
                                                       jint max_level) {
    (void)cls;
    jobject fresh = bridge == NULL ? NULL : (*env)->NewGlobalRef(env, bridge);
    if (bridge != NULL && fresh == NULL) {
        return; /* OutOfMemoryError pending */
    }
    pthread_mutex_lock(&g_set_logger_lock);
    pthread_mutex_lock(&g_log_lock);
    jobject old = g_log_bridge;
    g_log_bridge = fresh;
    pthread_mutex_unlock(&g_log_lock);
    int32_t rc = correx_set_log_callback(fresh == NULL ? NULL : log_cb, NULL, max_level);
    if (old != NULL) {
        (*env)->DeleteGlobalRef(env, old);
    }
    if (rc != CORREX_OK) {
        pthread_mutex_lock(&g_log_lock);
        if (g_log_bridge == fresh) {
            g_log_bridge = NULL;
        }
        pthread_mutex_unlock(&g_log_lock);
        if (fresh != NULL) {
            (*env)->DeleteGlobalRef(env, fresh);
        }
        pthread_mutex_unlock(&g_set_logger_lock);
        jclass ex = (*env)->FindClass(env, "java/lang/IllegalStateException");
        if (ex != NULL) {
            (*env)->ThrowNew(env, ex, "correx: another logger owns the log facade");
        }
        return;
    }
    pthread_mutex_unlock(&g_set_logger_lock);
}
