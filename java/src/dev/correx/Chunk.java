package dev.correx;

/** A piece of a streamed answer: answer text or the model's reasoning. */
public record Chunk(Kind kind, String text) {
    /** What a chunk holds. */
    public enum Kind {
        /** Answer text. */
        TEXT,
        /** The model's reasoning. */
        REASONING
    }
}
