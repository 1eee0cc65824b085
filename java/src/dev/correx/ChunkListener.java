package dev.correx;

/** Receives a streamed answer piece by piece (see {@link Models#stream}). */
@FunctionalInterface
public interface ChunkListener {
    /**
     * One piece, on the thread that called {@code stream}. Return true to go on, false to stop
     * the generation; an exception stops it too and is rethrown by {@code stream}.
     */
    boolean onChunk(Chunk chunk) throws Exception;
}
