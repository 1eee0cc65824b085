package dev.correx;

/**
 * A durable session step's result: the value, whether the log answered it (the step was
 * performed before, maybe by another process), the try that produced it, and whether it is a
 * dead run's recorded outcome (its host died while the tool ran; kind {@code interrupted}).
 *
 * @param <T> {@link InferenceResult} or {@link ToolResult}
 */
public record SessionStep<T>(T value, boolean replayed, int attempt, boolean recovered) {
}
