package dev.correx;

/** Receives correx's log records (see {@link Runtime#setLogger}). */
@FunctionalInterface
public interface LogListener {
    /** One record; it must return promptly and must not call correx. */
    void log(LogLevel level, String message);
}
