package dev.correx;

import java.util.ArrayList;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;

/**
 * What to ask a model: a system prompt, a task, earlier entries, and generation settings
 * ({@code temperature}, {@code max_tokens}, {@code seed}, ... as {@code correx_infer} names
 * them).
 */
public final class InferenceRequest {
    private final String json;

    private InferenceRequest(String json) {
        this.json = json;
    }

    /** A request given as {@code correx_infer}'s JSON. */
    public static InferenceRequest ofJson(String json) {
        if (json == null) {
            throw new InvalidArgumentException(CorrexException.E_NULL, "request is null");
        }
        return new InferenceRequest(json);
    }

    /** A request with one user message. */
    public static InferenceRequest of(String task) {
        return builder().task(task).build();
    }

    /** A builder. */
    public static Builder builder() {
        return new Builder();
    }

    /** The request JSON. */
    public String toJson() {
        return json;
    }

    /** Builds an {@link InferenceRequest}. */
    public static final class Builder {
        private final Map<String, Object> context = new LinkedHashMap<>();
        private final List<Object> entries = new ArrayList<>();
        private final Map<String, Object> config = new LinkedHashMap<>();
        private String session;

        private Builder() {}

        /**
         * The conversation this request belongs to: a remote model keeps a session's requests
         * on one endpoint, where its prompt is cached.
         */
        public Builder session(String s) {
            session = s;
            return this;
        }

        /** The system prompt. */
        public Builder system(String s) {
            context.put("system", s);
            return this;
        }

        /** The task (the last user message). */
        public Builder task(String s) {
            context.put("task", s);
            return this;
        }

        /** An earlier entry: {@code source} is {@code "user"}, {@code "model"} or {@code "tool"}. */
        public Builder entry(String source, String content) {
            Map<String, Object> e = new LinkedHashMap<>();
            e.put("source", source);
            e.put("content", content);
            entries.add(e);
            return this;
        }

        /** The most tokens to generate. */
        public Builder maxTokens(int n) {
            return option("max_tokens", n);
        }

        /** The sampling temperature. */
        public Builder temperature(double t) {
            return option("temperature", t);
        }

        /** The sampling seed. */
        public Builder seed(long seed) {
            return option("seed", seed);
        }

        /** Any other generation setting, as {@code correx_infer}'s {@code config} names it. */
        public Builder option(String name, Object value) {
            config.put(name, value);
            return this;
        }

        /** The request. */
        public InferenceRequest build() {
            Map<String, Object> ctx = new LinkedHashMap<>(context);
            if (!entries.isEmpty()) ctx.put("entries", entries);
            Map<String, Object> m = new LinkedHashMap<>();
            m.put("v", 1);
            m.put("context", ctx);
            m.put("config", config);
            if (session != null) m.put("session", session);
            return new InferenceRequest(Json.write(m));
        }
    }
}
