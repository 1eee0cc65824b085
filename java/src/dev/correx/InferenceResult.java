package dev.correx;

import java.util.List;
import java.util.Map;

/**
 * A model's answer: its text (and reasoning, when the model reasoned), why it ended, token
 * counts, latency, the model, tool calls it asked for, and the whole answer as JSON.
 */
public record InferenceResult(
        String text,
        String reasoning,
        String finishReason,
        long promptTokens,
        long completionTokens,
        long latencyMs,
        String model,
        List<Object> toolCalls,
        String json) {

    static InferenceResult from(String json) {
        Map<String, Object> m = Json.parseObject(json);
        Map<String, Object> usage = Json.obj(m, "usage");
        return new InferenceResult(
                Json.str(m, "text"),
                Json.str(m, "reasoning"),
                Json.str(m, "finish_reason"),
                Json.num(usage, "prompt_tokens", 0),
                Json.num(usage, "completion_tokens", 0),
                Json.num(m, "latency_ms", 0),
                Json.str(m, "model"),
                Json.list(m, "tool_calls"),
                json);
    }
}
