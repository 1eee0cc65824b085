package dev.correx;

import java.nio.file.Path;
import java.util.ArrayList;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.Set;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.atomic.AtomicReference;

/**
 * A correx runtime: the event log, the model manager and the sandboxed tools, opened from a
 * config (the JSON of {@code correx_runtime_new}, see docs/config.md, or a {@link Builder}).
 * Share one among threads freely; {@link #close()} it once: it waits for the calls in progress,
 * closes its subscriptions, stops its model servers and closes the log.
 *
 * <pre>{@code
 * try (Runtime rt = Runtime.builder().eventLog(Path.of("events.db")).fileRead(Path.of("work")).build()) {
 *     ToolResult r = rt.tools().execute(ToolRequest.of("s1", "file_read", Map.of("operation", "list", "path", ".")));
 * }
 * }</pre>
 */
public final class Runtime implements AutoCloseable {
    final Handle handle;
    private final EventLog events = new EventLog(this);
    private final Models models = new Models(this);
    private final Tools tools = new Tools(this);
    private final Jobs jobs = new Jobs(this);
    private final Approvals approvals = new Approvals(this);
    private final Set<Subscription> subscriptions = ConcurrentHashMap.newKeySet();
    private final AtomicReference<Throwable> callbackError = new AtomicReference<>();

    private Runtime(long ptr) {
        handle = new Handle("runtime", ptr);
    }

    /**
     * Opens a runtime from its config JSON. Blocks while it opens the log and recovers tool runs
     * a crashed host left.
     *
     * @throws ConfigException naming the field that is wrong
     * @throws InvalidArgumentException when the text is not JSON
     * @throws EventStoreException when the log cannot be opened
     * @throws ToolSetupException when a tool's allowed path or executable is missing
     */
    public static Runtime open(String configJson) {
        return new Runtime(Native.runtimeNew(Native.utf8(configJson, "config")));
    }

    /** As {@link #open(String)}, the config as a map (written as JSON; {@code "v": 1} is added). */
    public static Runtime open(Map<String, Object> config) {
        if (config == null) {
            throw new InvalidArgumentException(CorrexException.E_NULL, "config is null");
        }
        Map<String, Object> c = new LinkedHashMap<>(config);
        c.putIfAbsent("v", 1);
        return open(Json.write(c));
    }

    /** A builder for the common settings. */
    public static Builder builder() {
        return new Builder();
    }

    /** The loaded native library's C ABI version, {@code MAJOR << 16 | MINOR << 8 | PATCH}. */
    public static int abiVersion() {
        return Native.abiVersion();
    }

    /** The event log. */
    public EventLog events() {
        return events;
    }

    /** The model manager. */
    public Models models() {
        return models;
    }

    /** The sandboxed tools. */
    public Tools tools() {
        return tools;
    }

    /** The durable approval requests: list them, decide them. */
    public Approvals approvals() {
        return approvals;
    }

    /** The background jobs the shell started. */
    public Jobs jobs() {
        return jobs;
    }

    /**
     * The runtime's metrics as Prometheus text exposition (format 0.0.4, the body of a
     * {@code /metrics} endpoint): what the log records (tool runs by tool and outcome, approval
     * waits, inferences, tokens, loads, unloads by reason) and what the runtime knows live
     * (models resident and in flight, append latency). Reads what the log gained since the last
     * call.
     */
    public String metrics() {
        byte[] out;
        try (Handle.Use u = handle.use()) {
            out = Native.metrics(u.ptr);
        }
        return Native.text(out);
    }

    /**
     * Pins what is held of MCP server {@code server}: each tool whose definition changed since
     * it was pinned, or only those named in {@code tools} (names without the server's prefix).
     * Each is used from its next call, by this runtime and any other on the log.
     *
     * @return what was pinned as JSON, {@code {"v": 1, "pinned": {"tool": "sha256:...", ...}}},
     *     empty when nothing was held
     * @throws NotFoundException when the config has no such server
     */
    public String pinMcpToolsJson(String server, String... tools) {
        Map<String, Object> m = new LinkedHashMap<>();
        m.put("v", 1);
        m.put("server", server == null ? "" : server);
        m.put("tools", tools == null ? List.of() : java.util.Arrays.asList(tools));
        byte[] request = Native.utf8(Json.write(m), "request");
        byte[] out;
        try (Handle.Use u = handle.use()) {
            out = Native.mcpPin(u.ptr, request);
        }
        return Native.text(out);
    }

    /** Durable session {@code id}: steps performed once, answered from the log after. */
    public Session session(String id) {
        return new Session(this, id);
    }

    /**
     * Sets the approver asked for every T2 and T3 tool run (rules in the config's
     * {@code approvals.rules} are checked first), or with null denies them all (the state of a
     * new runtime). It runs on the thread that called {@link Tools#execute}; it may block (to ask
     * a person) and may call this runtime, but not close it. An approver that throws denies the
     * run; the exception is kept for {@link #lastCallbackError()}.
     */
    public void setApprover(Approver approver) {
        Native.ApproverBridge bridge = approver == null ? null : new Native.ApproverBridge() {
            @Override
            int approve(byte[] tool, int tier, byte[] requestJson) {
                try {
                    ApprovalRequest r = ApprovalRequest.from(Native.text(tool), tier, Native.text(requestJson));
                    Decision d = approver.decide(r);
                    return d == null ? Decision.DENY.code : d.code;
                } catch (Throwable t) {
                    callbackError.set(t);
                    return Decision.DENY.code;
                }
            }
        };
        try (Handle.Use u = handle.use()) {
            Native.setApprover(u.ptr, bridge);
        }
    }

    /**
     * Sets the handler of requests MCP servers send their client, for {@code methods} (at least
     * one), or with null removes it (those requests are then refused and servers are told none is
     * answered: the state of a new runtime). A server learns at its start what this client answers,
     * so one already running is restarted before its next use when that changed (once no call of it
     * is in progress): set it right after opening the runtime. The handler runs on a correx thread
     * and may block (to ask a person, or to run a model), but must not close this runtime; closing
     * it waits for handlers in progress, which see {@link McpRequest#isCancelled()} turn true. A
     * handler that returns null, throws, or answers with anything but a JSON object declines
     * (JSON-RPC error -1 to the server).
     */
    public void setMcpHandler(java.util.Set<McpMethod> methods, McpHandler handler) {
        int bits = 0;
        if (handler != null) {
            if (methods == null || methods.isEmpty()) {
                throw new IllegalArgumentException("methods: name at least one McpMethod");
            }
            for (McpMethod m : methods) bits |= m.bit;
        }
        Native.McpBridge bridge = handler == null ? null : new Native.McpBridge() {
            @Override
            byte[] answer(byte[] server, byte[] method, byte[] paramsJson, long answer) {
                McpRequest r = null;
                try {
                    r = new McpRequest(Native.text(server), McpMethod.of(Native.text(method)),
                            Native.text(paramsJson), answer);
                    String json = handler.answer(r);
                    if (json == null) return null;
                    Json.parseObject(json); // not an object: declined, and kept as the error
                    return Native.utf8(json, "the MCP handler's answer");
                } catch (Throwable t) {
                    callbackError.set(t);
                    return null;
                } finally {
                    if (r != null) r.end();
                }
            }
        };
        try (Handle.Use u = handle.use()) {
            Native.setMcpHandler(u.ptr, bits, bridge);
        }
    }

    /**
     * The last exception an approver, stream listener or MCP handler of this runtime threw, or
     * an MCP handler's answer that was not a JSON object (null: none).
     */
    public Throwable lastCallbackError() {
        return callbackError.get();
    }

    void callbackFailed(Throwable t) {
        callbackError.set(t);
    }

    /** Whether it was closed. */
    public boolean isClosed() {
        return handle.isClosed();
    }

    /**
     * Closes its subscriptions (a thread waiting in one sees it end), waits for every call in
     * progress to return, then stops its model servers and closes the log. Idempotent. Must not
     * be called from a callback of this runtime.
     */
    @Override
    public void close() {
        if (handle.usedByThisThread()) {
            throw new IllegalStateException("a runtime cannot be closed from inside one of its calls (a callback)");
        }
        for (Subscription s : new ArrayList<>(subscriptions)) {
            s.close();
        }
        handle.close(Native::runtimeFree);
        // A subscribe that was under way when the close began tracks its subscription late.
        for (Subscription s : new ArrayList<>(subscriptions)) {
            s.close();
        }
    }

    Subscription track(Subscription s) {
        subscriptions.add(s);
        if (handle.isClosed()) {
            s.close();
        }
        return s;
    }

    void untrack(Subscription s) {
        subscriptions.remove(s);
    }

    /**
     * Sets (null: clears) the process-wide listener of correx's log records at or below
     * {@code maxLevel}. It may be called from any thread, correx's own included, while correx
     * holds internal locks: it must return promptly and must not call correx. An exception it
     * throws is dropped.
     *
     * @throws IllegalStateException when a Rust host in this process owns the log facade
     */
    public static void setLogger(LogListener listener, LogLevel maxLevel) {
        Native.LogBridge bridge = listener == null ? null : new Native.LogBridge() {
            @Override
            void log(int level, byte[] message) {
                try {
                    listener.log(LogLevel.of(level), Native.text(message));
                } catch (Throwable ignored) {
                    // A logger must not take correx down.
                }
            }
        };
        Native.setLogger(bridge, maxLevel == null ? LogLevel.INFO.level : maxLevel.level);
    }

    /** The common settings of a runtime; anything else through {@link #set}. */
    public static final class Builder {
        private final Map<String, Object> config = new LinkedHashMap<>();
        private final Map<String, Object> toolsConfig = new LinkedHashMap<>();

        private Builder() {
            config.put("v", 1);
        }

        /** The event log's file (required). */
        public Builder eventLog(Path path) {
            config.put("event_log", path.toAbsolutePath().toString());
            return this;
        }

        /** Where sandbox journals go (default: a private directory under the temp directory). */
        public Builder sandboxRoot(Path path) {
            config.put("sandbox_root", path.toAbsolutePath().toString());
            return this;
        }

        /** Enables {@code file_read} under these roots. */
        public Builder fileRead(Path... roots) {
            return fileTool("file_read", roots);
        }

        /** Enables {@code file_write} under these roots. */
        public Builder fileWrite(Path... roots) {
            return fileTool("file_write", roots);
        }

        /** Enables {@code file_edit} under these roots. */
        public Builder fileEdit(Path... roots) {
            return fileTool("file_edit", roots);
        }

        /** Enables the shell with these executables allowed (names on PATH or absolute paths). */
        public Builder shell(String... allowedExecutables) {
            shellConfig().put("allowed_executables", List.of(allowedExecutables));
            return this;
        }

        /**
         * The directories a shell run may start in and read and write beneath (the first is the
         * default); without any it starts in a private temp directory and sees nothing else.
         */
        public Builder shellWorkingDirs(Path... dirs) {
            List<String> paths = new ArrayList<>();
            for (Path p : dirs) paths.add(p.toAbsolutePath().toString());
            shellConfig().put("working_dirs", paths);
            return this;
        }

        @SuppressWarnings("unchecked")
        private Map<String, Object> shellConfig() {
            Map<String, Object> t = (Map<String, Object>) toolsConfig.computeIfAbsent("shell", k -> new LinkedHashMap<>());
            t.put("enabled", true);
            return t;
        }

        /** Sets a top-level config field as is (for example {@code "models"} or {@code "approvals"}). */
        public Builder set(String field, Object value) {
            config.put(field, value);
            return this;
        }

        private Builder fileTool(String name, Path... roots) {
            List<String> paths = new ArrayList<>();
            for (Path p : roots) paths.add(p.toAbsolutePath().toString());
            Map<String, Object> t = new LinkedHashMap<>();
            t.put("enabled", true);
            t.put("allowed_paths", paths);
            toolsConfig.put(name, t);
            return this;
        }

        /** The config as JSON. */
        public String toJson() {
            Map<String, Object> c = new LinkedHashMap<>(config);
            if (!toolsConfig.isEmpty()) c.put("tools", toolsConfig);
            return Json.write(c);
        }

        /** Opens the runtime; see {@link Runtime#open(String)}. */
        public Runtime build() {
            return open(toJson());
        }
    }
}
