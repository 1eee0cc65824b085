package dev.correx;

import java.util.List;
import java.util.Map;

/**
 * One vector per input, in the order the inputs were given, with the model that computed them,
 * the tokens the server read and the call's latency.
 */
public record Embeddings(String model, float[][] vectors, long promptTokens, long latencyMs) {

    static Embeddings from(String json) {
        Map<String, Object> m = Json.parseObject(json);
        List<Object> rows = Json.list(m, "vectors");
        float[][] vectors = new float[rows.size()][];
        for (int i = 0; i < vectors.length; i++) {
            List<?> row = (List<?>) rows.get(i);
            float[] v = new float[row.size()];
            for (int j = 0; j < v.length; j++) v[j] = ((Number) row.get(j)).floatValue();
            vectors[i] = v;
        }
        return new Embeddings(
                Json.str(m, "model"),
                vectors,
                Json.num(m, "prompt_tokens", 0),
                Json.num(m, "latency_ms", 0));
    }
}
