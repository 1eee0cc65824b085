package dev.correx;

/** How long a loaded model stays resident. */
public enum Residency {
    /** Until it is unloaded or replaced. */
    PERSISTENT,
    /** Until it was idle for its idle timeout. */
    DYNAMIC,
    /** For one inference. */
    EPHEMERAL
}
