package dev.correx;

import java.nio.file.Path;
import java.time.Duration;
import java.util.ArrayList;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Locale;
import java.util.Map;

/**
 * A model to load: its id, GGUF file (default: the model {@code scripts/install-llama.sh}
 * installed) or remote endpoints, residency and server settings.
 */
public final class ModelDescriptor {
    private final Map<String, Object> fields;

    private ModelDescriptor(Map<String, Object> fields) {
        this.fields = fields;
    }

    /** A builder for the model {@code modelId}, persistent unless told otherwise. */
    public static Builder builder(String modelId) {
        return new Builder(modelId);
    }

    /** The model's id. */
    public String modelId() {
        return (String) fields.get("model_id");
    }

    /** The descriptor JSON {@code correx_model_load} takes. */
    public String toJson() {
        return Json.write(fields);
    }

    @Override
    public String toString() {
        return toJson();
    }

    /** Builds a {@link ModelDescriptor}. */
    public static final class Builder {
        private final Map<String, Object> f = new LinkedHashMap<>();

        private Builder(String modelId) {
            if (modelId == null) {
                throw new InvalidArgumentException(CorrexException.E_NULL, "modelId is null");
            }
            f.put("v", 1);
            f.put("model_id", modelId);
            f.put("residency", "persistent");
        }

        /** The GGUF file. */
        public Builder path(Path gguf) {
            f.put("model_path", gguf.toAbsolutePath().toString());
            return this;
        }

        /** The residency; for {@link Residency#DYNAMIC} see {@link #idleTimeout}. */
        public Builder residency(Residency r) {
            f.put("residency", r.name().toLowerCase(Locale.ROOT));
            return this;
        }

        /** A DYNAMIC model's idle timeout. */
        public Builder idleTimeout(Duration d) {
            f.put("idle_timeout_ms", d.toMillis());
            return this;
        }

        /** The context size in tokens. */
        public Builder contextSize(int tokens) {
            f.put("context_size", tokens);
            return this;
        }

        /** The server's threads. */
        public Builder threads(int n) {
            f.put("threads", n);
            return this;
        }

        /**
         * What the model serves: {@code "chat"} (the default) or {@code "embeddings"} (its
         * server runs with {@code --embeddings}; see {@link Models#embed}).
         */
        public Builder serves(String role) {
            f.put("serves", role);
            return this;
        }

        /** More llama-server arguments. */
        public Builder extraArgs(String... args) {
            f.put("extra_args", List.of(args));
            return this;
        }

        /** Servers already running elsewhere, instead of a file (nothing is spawned). */
        public Builder endpoints(String... urls) {
            f.put("endpoints", new ArrayList<>(List.of(urls)));
            return this;
        }

        /**
         * What the endpoints speak: {@code "llama-server"} (the default) or {@code "openai"}
         * (vLLM, SGLang, any engine with OpenAI's chat completions and model list).
         */
        public Builder endpointKind(String kind) {
            f.put("endpoint_kind", kind);
            return this;
        }

        /** The environment variable holding the endpoints' API key (never recorded). */
        public Builder apiKeyEnv(String variable) {
            f.put("api_key_env", variable);
            return this;
        }

        /** The model name the endpoints serve; default the model id. */
        public Builder servedModel(String name) {
            f.put("served_model", name);
            return this;
        }

        /** The descriptor. */
        public ModelDescriptor build() {
            return new ModelDescriptor(new LinkedHashMap<>(f));
        }
    }
}
