package dev.correx;

import java.nio.charset.StandardCharsets;
import java.util.List;
import java.util.Map;
import java.util.Optional;

/**
 * The runtime's models: load, unload, status, inference whole or streamed. Calls may come from
 * any thread; inferences run concurrently, and loads of different models too.
 */
public final class Models {
    private final Runtime runtime;

    Models(Runtime runtime) {
        this.runtime = runtime;
    }

    /** Loads a model (a no-op when it is loaded as described); blocks until its server is healthy. */
    public void load(ModelDescriptor model) {
        load(model, null);
    }

    /**
     * As {@link #load(ModelDescriptor)}, stoppable through {@code cancel}.
     *
     * @throws ModelException when it cannot be loaded (the message quotes the server's log)
     * @throws BusyException when no model could make room in time; nothing changed
     * @throws CancelledException when cancelled
     */
    public void load(ModelDescriptor model, Cancellation cancel) {
        if (model == null) {
            throw new InvalidArgumentException(CorrexException.E_NULL, "model is null");
        }
        loadJson(model.toJson(), cancel);
    }

    /** As {@link #load(ModelDescriptor, Cancellation)}, the descriptor as JSON. */
    public void loadJson(String descriptorJson, Cancellation cancel) {
        byte[] d = Native.utf8(descriptorJson, "descriptor");
        try (Handle.Use u = runtime.handle.use(); Handle.Use c = use(cancel)) {
            Native.modelLoad(u.ptr, d, c == null ? 0 : c.ptr);
        }
    }

    /** Unloads a model if it is loaded, after its running inferences finish. */
    public void unload(String modelId) {
        byte[] m = Native.utf8(modelId, "modelId");
        try (Handle.Use u = runtime.handle.use()) {
            Native.modelUnload(u.ptr, m);
        }
    }

    /** What is loaded, loading or unloading, by model id. Never waits for a load. */
    public List<ModelStatus> status() {
        Map<String, Object> m;
        try (Handle.Use u = runtime.handle.use()) {
            m = Json.parseObject(Native.text(Native.modelsStatus(u.ptr)));
        }
        return Json.objects(m, "models", ModelStatus::from);
    }

    /** The id of the most recently used loaded model, if any. */
    public Optional<String> current() {
        Map<String, Object> m;
        try (Handle.Use u = runtime.handle.use()) {
            m = Json.parseObject(Native.text(Native.modelCurrent(u.ptr)));
        }
        return Optional.ofNullable(Json.str(Json.obj(m, "model"), "model_id"));
    }

    /** Whether every loaded model's server answers; empty when all do, else the reason. */
    public Optional<String> unhealthy() {
        Map<String, Object> m;
        try (Handle.Use u = runtime.handle.use()) {
            m = Json.parseObject(Native.text(Native.modelHealth(u.ptr)));
        }
        return Json.bool(m, "healthy") ? Optional.empty() : Optional.ofNullable(Json.str(m, "reason"));
    }

    /** The token count of {@code text} (approximated when no model answers). */
    public long countTokens(String text) {
        byte[] t = Native.utf8(text, "text");
        try (Handle.Use u = runtime.handle.use()) {
            return Native.countTokens(u.ptr, t);
        }
    }

    /** The loaded model's tokens for {@code text}. */
    public long[] tokenize(String text) {
        byte[] t = Native.utf8(text, "text");
        Map<String, Object> m;
        try (Handle.Use u = runtime.handle.use()) {
            m = Json.parseObject(Native.text(Native.tokenize(u.ptr, t)));
        }
        List<Object> l = Json.list(m, "tokens");
        long[] out = new long[l.size()];
        for (int i = 0; i < out.length; i++) out[i] = ((Number) l.get(i)).longValue();
        return out;
    }

    /** One inference on a loaded model; blocks for the whole generation. */
    public InferenceResult infer(String modelId, InferenceRequest request) {
        return infer(modelId, request, null);
    }

    /**
     * As {@link #infer(String, InferenceRequest)}, stoppable through {@code cancel}.
     *
     * @throws UnknownModelException when the model was never loaded through this runtime
     * @throws InferenceException when the server failed
     * @throws CancelledException when cancelled
     */
    public InferenceResult infer(String modelId, InferenceRequest request, Cancellation cancel) {
        byte[] m = Native.utf8(modelId, "modelId");
        byte[] r = Native.utf8(request == null ? null : request.toJson(), "request");
        byte[] out;
        try (Handle.Use u = runtime.handle.use(); Handle.Use c = use(cancel)) {
            out = Native.infer(u.ptr, m, r, c == null ? 0 : c.ptr);
        }
        return InferenceResult.from(Native.text(out));
    }

    /** As {@link #embed(String, List, Cancellation)} without a cancellation. */
    public Embeddings embed(String modelId, List<String> inputs) {
        return embed(modelId, inputs, null);
    }

    /**
     * Embeds {@code inputs} (1 to 1,024 texts, none empty) on a loaded model whose descriptor
     * says {@code serves("embeddings")}, loading it again first if it was evicted; one vector per
     * input, in input order. Recorded as {@code embedding.completed}.
     *
     * @throws InvalidArgumentException for no inputs, an empty one, too many, or a chat model
     *     (nothing is sent)
     * @throws UnknownModelException when the model was never loaded through this runtime
     * @throws InferenceException when the server failed
     * @throws CancelledException when cancelled
     */
    public Embeddings embed(String modelId, List<String> inputs, Cancellation cancel) {
        byte[] m = Native.utf8(modelId, "modelId");
        if (inputs == null) {
            throw new InvalidArgumentException(CorrexException.E_NULL, "inputs is null");
        }
        Map<String, Object> body = new java.util.LinkedHashMap<>();
        body.put("v", 1);
        body.put("inputs", new java.util.ArrayList<Object>(inputs));
        byte[] i = Native.utf8(Json.write(body), "inputs");
        byte[] out;
        try (Handle.Use u = runtime.handle.use(); Handle.Use c = use(cancel)) {
            out = Native.embed(u.ptr, m, i, c == null ? 0 : c.ptr);
        }
        return Embeddings.from(Native.text(out));
    }

    /** As {@link #stream(String, InferenceRequest, ChunkListener, Cancellation)} without a cancellation. */
    public InferenceResult stream(String modelId, InferenceRequest request, ChunkListener listener) {
        return stream(modelId, request, listener, null);
    }

    /**
     * An inference handing each piece of the answer to {@code listener} as it arrives, on this
     * thread; returns the whole answer. A listener that returns false stops the generation
     * ({@link CancelledException}); one that throws stops it too, and its exception is the
     * cause of the {@link CancelledException} thrown here.
     */
    public InferenceResult stream(String modelId, InferenceRequest request, ChunkListener listener, Cancellation cancel) {
        byte[] m = Native.utf8(modelId, "modelId");
        byte[] r = Native.utf8(request == null ? null : request.toJson(), "request");
        if (listener == null) {
            throw new InvalidArgumentException(CorrexException.E_NULL, "listener is null");
        }
        Throwable[] thrown = new Throwable[1];
        Native.ChunkBridge bridge = bridge(runtime, listener, thrown);
        byte[] out;
        try (Handle.Use u = runtime.handle.use(); Handle.Use c = use(cancel)) {
            out = Native.inferStream(u.ptr, m, r, c == null ? 0 : c.ptr, bridge);
        } catch (CancelledException e) {
            throw listenerStopped(e, thrown);
        }
        return InferenceResult.from(Native.text(out));
    }

    /** The native side's callback into {@code listener}; what it throws lands in {@code thrown}. */
    static Native.ChunkBridge bridge(Runtime runtime, ChunkListener listener, Throwable[] thrown) {
        return new Native.ChunkBridge() {
            @Override
            boolean chunk(int kind, byte[] text) {
                try {
                    Chunk.Kind k = kind == 1 ? Chunk.Kind.REASONING : Chunk.Kind.TEXT;
                    return listener.onChunk(new Chunk(k, new String(text, StandardCharsets.UTF_8)));
                } catch (Throwable t) {
                    thrown[0] = t;
                    runtime.callbackFailed(t);
                    return false;
                }
            }
        };
    }

    /** A cancel caused by a listener that threw names that exception as its cause. */
    static CancelledException listenerStopped(CancelledException e, Throwable[] thrown) {
        if (thrown[0] == null) {
            return e;
        }
        CancelledException x = new CancelledException(
                CorrexException.E_CANCELLED, "the chunk listener threw, which stopped the stream: " + thrown[0]);
        x.initCause(thrown[0]);
        return x;
    }

    static Handle.Use use(Cancellation c) {
        return c == null ? null : c.handle.use();
    }
}
