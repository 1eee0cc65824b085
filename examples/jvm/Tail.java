// Follows an event log through Panama (JDK 22+) while another process writes it:
//   java --enable-native-access=ALL-UNNAMED -Dcorrex.lib=target/release/libcorrex.so \
//       examples/jvm/Tail.java /path/events.db [STOP_TYPE]
// Prints each event's summary as it is appended, history first; exits 0 after an event of
// STOP_TYPE (default model.unloaded), 1 when nothing arrives for 120 s.

import java.lang.foreign.*;
import java.lang.invoke.*;
import java.nio.file.*;
import java.util.regex.*;

public class Tail {
    static final Linker LINKER = Linker.nativeLinker();
    static final ValueLayout.OfInt I32 = ValueLayout.JAVA_INT;
    static final AddressLayout PTR = ValueLayout.ADDRESS;

    static String field(String json, String key) {
        Matcher m = Pattern.compile("\"" + key + "\":(\"((?:[^\"\\\\]|\\\\.)*)\"|-?\\d+)").matcher(json);
        if (!m.find()) return "";
        return m.group(2) != null ? m.group(2) : m.group(1);
    }

    public static void main(String[] args) throws Throwable {
        Path log = Path.of(args[0]);
        String stopType = args.length > 1 ? args[1] : "model.unloaded";
        String libPath = System.getProperty("correx.lib", "target/release/libcorrex.so");
        try (Arena arena = Arena.ofConfined()) {
            SymbolLookup lib = SymbolLookup.libraryLookup(Path.of(libPath), arena);
            java.util.function.BiFunction<String, FunctionDescriptor, MethodHandle> fn =
                    (name, d) -> LINKER.downcallHandle(lib.find(name).orElseThrow(), d);
            MethodHandle runtimeNew = fn.apply("correx_runtime_new", FunctionDescriptor.of(I32, PTR, PTR, PTR));
            MethodHandle runtimeFree = fn.apply("correx_runtime_free", FunctionDescriptor.ofVoid(PTR));
            MethodHandle subscribe = fn.apply("correx_subscribe", FunctionDescriptor.of(I32, PTR, ValueLayout.JAVA_LONG, PTR, PTR));
            MethodHandle next = fn.apply("correx_subscription_next", FunctionDescriptor.of(I32, PTR, I32, PTR, PTR));
            MethodHandle subFree = fn.apply("correx_subscription_free", FunctionDescriptor.ofVoid(PTR));
            MethodHandle stringFree = fn.apply("correx_string_free", FunctionDescriptor.ofVoid(PTR));

            // This process's own runtime on the same log (its sandbox root is its own).
            Path sandbox = Files.createTempDirectory("correx-tail-");
            String config = "{\"v\": 1, \"event_log\": \"" + log + "\", \"sandbox_root\": \"" + sandbox + "\"}";
            MemorySegment out = arena.allocate(PTR);
            if ((int) runtimeNew.invokeExact(arena.allocateFrom(config), out, MemorySegment.NULL) != 0)
                throw new IllegalStateException("could not open " + log);
            MemorySegment rt = out.get(PTR, 0);
            int seen = 0;
            boolean stopped = false;
            try {
                if ((int) subscribe.invokeExact(rt, 0L, out, MemorySegment.NULL) != 0)
                    throw new IllegalStateException("could not subscribe");
                MemorySegment sub = out.get(PTR, 0);
                try {
                    while (!stopped) {
                        if ((int) next.invokeExact(sub, 120_000, out, MemorySegment.NULL) != 0)
                            throw new IllegalStateException("reading the log failed");
                        MemorySegment s = out.get(PTR, 0);
                        if (s.equals(MemorySegment.NULL)) break; // nothing for 120 s
                        String event = s.reinterpret(Long.MAX_VALUE).getString(0);
                        stringFree.invokeExact(s);
                        seen++;
                        System.out.println("  tail #" + field(event, "position") + " " + field(event, "type_id") + ": " + field(event, "summary"));
                        stopped = field(event, "type_id").equals(stopType);
                    }
                } finally {
                    subFree.invokeExact(sub);
                }
            } finally {
                runtimeFree.invokeExact(rt);
                try (var paths = Files.walk(sandbox)) {
                    paths.sorted(java.util.Comparator.reverseOrder()).forEach(p -> p.toFile().delete());
                }
            }
            System.out.println("tail: " + seen + " events" + (stopped ? ", stopped at " + stopType : ", timed out"));
            System.exit(stopped ? 0 : 1);
        }
    }
}
