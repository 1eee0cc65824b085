package dev.correx;

import java.io.IOException;
import java.io.InputStream;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.StandardCopyOption;

/**
 * The native methods (java/native/correx_jni.c over include/correx.h) and the loading of their
 * library: the path in the system property {@code correx.jni.library} when set, else the copy
 * inside this jar for this platform, else {@code correx_jni} on {@code java.library.path}.
 */
final class Native {
    private Native() {}

    /** The C ABI's major version this jar was built for; the library's must match. */
    static final int ABI_MAJOR = 0;
    /** The least minor version with every call this jar uses. */
    static final int ABI_MINOR = 3;

    static {
        load();
        int v = abiVersion();
        if ((v >> 16) != ABI_MAJOR || ((v >> 8) & 0xff) < ABI_MINOR) {
            throw new UnsatisfiedLinkError(String.format(
                    "correx: the native library has ABI %d.%d.%d; this jar needs %d.%d or a later minor",
                    v >> 16, (v >> 8) & 0xff, v & 0xff, ABI_MAJOR, ABI_MINOR));
        }
    }

    static String platform() {
        String os = System.getProperty("os.name", "").toLowerCase(java.util.Locale.ROOT);
        String arch = System.getProperty("os.arch", "").toLowerCase(java.util.Locale.ROOT);
        if (arch.equals("amd64") || arch.equals("x86_64")) arch = "x86_64";
        if (arch.equals("arm64")) arch = "aarch64";
        return (os.startsWith("linux") ? "linux" : os.replace(' ', '_')) + "-" + arch;
    }

    private static void load() {
        String explicit = System.getProperty("correx.jni.library");
        if (explicit != null && !explicit.isEmpty()) {
            System.load(Path.of(explicit).toAbsolutePath().toString());
            return;
        }
        String resource = "/dev/correx/native/" + platform() + "/libcorrex_jni.so";
        try (InputStream in = Native.class.getResourceAsStream(resource)) {
            if (in != null) {
                Path dir = Files.createTempDirectory("correx-jni");
                Path lib = dir.resolve("libcorrex_jni.so");
                try {
                    Files.copy(in, lib, StandardCopyOption.REPLACE_EXISTING);
                    System.load(lib.toString());
                } finally {
                    // Mapped once loaded: the file is no longer needed.
                    Files.deleteIfExists(lib);
                    Files.deleteIfExists(dir);
                }
                return;
            }
        } catch (IOException e) {
            throw new UnsatisfiedLinkError("correx: extracting " + resource + " from the jar: " + e);
        }
        try {
            System.loadLibrary("correx_jni");
        } catch (UnsatisfiedLinkError e) {
            throw new UnsatisfiedLinkError("correx: this jar holds no native library for " + platform()
                    + " and libcorrex_jni.so is not on java.library.path (" + e.getMessage()
                    + "); build it with `make -C java` or set -Dcorrex.jni.library=/path/libcorrex_jni.so");
        }
    }

    /**
     * UTF-8 bytes of {@code s}, refusing null, NUL characters (C strings end at NUL) and lone
     * surrogates (which have no UTF-8; a silent '?' would change an id).
     */
    static byte[] utf8(String s, String what) {
        if (s == null) {
            throw new InvalidArgumentException(CorrexException.E_NULL, what + " is null");
        }
        if (s.indexOf('\0') >= 0) {
            throw new InvalidArgumentException(CorrexException.E_INVALID_ARGUMENT, what + " holds a NUL character");
        }
        try {
            java.nio.ByteBuffer b = StandardCharsets.UTF_8.newEncoder()
                    .onMalformedInput(java.nio.charset.CodingErrorAction.REPORT)
                    .onUnmappableCharacter(java.nio.charset.CodingErrorAction.REPORT)
                    .encode(java.nio.CharBuffer.wrap(s));
            byte[] out = new byte[b.remaining()];
            b.get(out);
            return out;
        } catch (java.nio.charset.CharacterCodingException e) {
            throw new InvalidArgumentException(
                    CorrexException.E_INVALID_ARGUMENT, what + " holds a lone surrogate, which UTF-8 cannot carry");
        }
    }

    static String text(byte[] b) {
        return b == null ? null : new String(b, StandardCharsets.UTF_8);
    }

    /** Receives approval requests from correx; never throws (see {@link Runtime#setApprover}). */
    abstract static class ApproverBridge {
        abstract int approve(byte[] tool, int tier, byte[] requestJson);
    }

    /** Receives MCP servers' requests to the host; null declines. Never throws. */
    abstract static class McpBridge {
        abstract byte[] answer(byte[] server, byte[] method, byte[] paramsJson, long answer);
    }

    /** Receives stream chunks; false stops the generation. Never throws. */
    abstract static class ChunkBridge {
        abstract boolean chunk(int kind, byte[] text);
    }

    /** Receives log records. Never throws. */
    abstract static class LogBridge {
        abstract void log(int level, byte[] message);
    }

    static native int abiVersion();

    static native long runtimeNew(byte[] config);

    static native void runtimeFree(long rt);

    static native void setApprover(long rt, ApproverBridge bridge);

    static native void setMcpHandler(long rt, int methods, McpBridge bridge);

    static native boolean mcpAnswerCancelled(long answer);

    static native byte[] eventsAppend(long rt, byte[] stream, int kind, long version, byte[] events);

    static native byte[] eventsReadStream(long rt, byte[] stream, long from, int max);

    static native byte[] eventsReadAll(long rt, long from, int max);

    static native long eventsLastPosition(long rt);

    static native long subscribe(long rt, long after);

    static native byte[] subscriptionNext(long sub, int timeoutMs);

    static native long subscriptionPosition(long sub);

    static native void subscriptionFree(long sub);

    static native long cancelNew();

    static native void cancelTrigger(long cancel);

    static native void cancelReset(long cancel);

    static native void cancelFree(long cancel);

    static native void modelLoad(long rt, byte[] descriptor, long cancel);

    static native void modelUnload(long rt, byte[] model);

    static native byte[] modelsStatus(long rt);

    static native byte[] modelCurrent(long rt);

    static native byte[] modelHealth(long rt);

    static native long countTokens(long rt, byte[] text);

    static native byte[] tokenize(long rt, byte[] text);

    static native byte[] infer(long rt, byte[] model, byte[] request, long cancel);

    static native byte[] embed(long rt, byte[] model, byte[] inputs, long cancel);

    static native byte[] sessionInfer(long rt, byte[] session, byte[] step, byte[] model, byte[] request, long cancel,
                                      ChunkBridge bridge);

    static native byte[] sessionExecute(long rt, byte[] session, byte[] step, byte[] request, long cancel);

    static native byte[] sessionTranscript(long rt, byte[] session);

    static native byte[] metrics(long rt);

    static native byte[] inferStream(long rt, byte[] model, byte[] request, long cancel, ChunkBridge bridge);

    static native byte[] toolsList(long rt);

    static native byte[] toolExecute(long rt, byte[] request, long cancel);

    static native byte[] jobs(long rt, byte[] request, long cancel);

    static native void sessionEnd(long rt, byte[] session);

    static native byte[] sessionWait(long rt, byte[] session, byte[] step, byte[] wait, long cancel);

    static native byte[] sessionSignal(long rt, byte[] session, byte[] signal);

    static native byte[] approvalsDecide(long rt, byte[] session, byte[] request, byte[] decision);

    static native byte[] approvalsList(long rt, byte[] session, int all);

    static native byte[] mcpPin(long rt, byte[] request);

    static native void setLogger(LogBridge bridge, int maxLevel);
}
