package dev.correx;

/**
 * A durable session step's result: the value, whether the log answered it (the step was
 * performed before, maybe by another process), and the try that produced it.
 *
 * @param <T> {@link InferenceResult} or {@link ToolResult}
 */
public record SessionStep<T>(T value, boolean replayed, int attempt) {
}
