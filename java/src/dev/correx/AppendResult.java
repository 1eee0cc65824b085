package dev.correx;

/** Where an append landed: the first and last global positions and the stream's new version. */
public record AppendResult(long firstPosition, long lastPosition, long streamVersion) {}
