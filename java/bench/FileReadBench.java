package dev.correx.bench;

import dev.correx.Runtime;
import dev.correx.ToolRequest;
import dev.correx.ToolResult;
import java.util.Map;

/**
 * For {@code cargo bench --bench ffi}: a T1 {@code file_read} of {@code data.txt} through the
 * Java API, after a warm-up. Args: config JSON, rounds, calls per round. Each round starts when
 * a line arrives on stdin (so the bench can alternate it with the C calls) and prints
 * {@code round_us: <mean µs per call>}.
 */
public final class FileReadBench {
    public static void main(String[] args) {
        int rounds = Integer.parseInt(args[1]);
        int calls = Integer.parseInt(args[2]);
        ToolRequest req = ToolRequest.of("b", "file_read", Map.of("operation", "read", "path", "data.txt"));
        try (Runtime rt = Runtime.open(args[0])) {
            // Enough calls for the JIT to compile the JSON and call paths.
            for (int i = 0; i < 3000; i++) {
                check(rt.tools().execute(req));
            }
            System.out.println("ready");
            System.out.flush();
            java.io.BufferedReader in = new java.io.BufferedReader(new java.io.InputStreamReader(System.in));
            for (int r = 0; r < rounds; r++) {
                try {
                    if (in.readLine() == null) return;
                } catch (java.io.IOException e) {
                    throw new java.io.UncheckedIOException(e);
                }
                long t = System.nanoTime();
                for (int i = 0; i < calls; i++) {
                    check(rt.tools().execute(req));
                }
                System.out.printf("round_us: %.1f%n", (System.nanoTime() - t) / 1e3 / calls);
                System.out.flush();
            }
        }
    }

    private static void check(ToolResult r) {
        if (!r.success()) throw new AssertionError(r.reason());
    }
}
