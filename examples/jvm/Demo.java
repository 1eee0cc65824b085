// The correx demo from Java through Panama (java.lang.foreign, JDK 22+):
//   java --enable-native-access=ALL-UNNAMED -Dcorrex.lib=target/release/libcorrex.so examples/jvm/Demo.java
// Opens the event log, loads Gemma, asks a question (the answer printed piece by piece as it
// streams), runs a file_write the approver approves and a shell call it denies, then prints the
// event log.

import java.lang.foreign.*;
import java.lang.invoke.*;
import java.nio.file.*;
import java.util.regex.*;

public class Demo {
    static final Linker LINKER = Linker.nativeLinker();
    static SymbolLookup lib;

    static MethodHandle fn(String name, FunctionDescriptor d) {
        return LINKER.downcallHandle(lib.find(name).orElseThrow(() -> new IllegalStateException("missing " + name)), d);
    }

    static final ValueLayout.OfInt I32 = ValueLayout.JAVA_INT;
    static final AddressLayout PTR = ValueLayout.ADDRESS;

    static MethodHandle runtimeNew, runtimeFree, setApprover, modelLoad, modelUnload, inferStream,
            toolExecute, readAll, stringFree, errorMessage, errorFree;

    /** Throws with correx's message when a call failed; frees the error. */
    static void check(String what, int rc, MemorySegment errOut) throws Throwable {
        if (rc == 0) return;
        MemorySegment err = errOut.get(PTR, 0);
        String msg = ((MemorySegment) errorMessage.invokeExact(err)).reinterpret(Long.MAX_VALUE).getString(0);
        errorFree.invokeExact(err);
        throw new IllegalStateException(what + " failed (" + rc + "): " + msg);
    }

    /** Takes ownership of a string correx returned. */
    static String take(MemorySegment out) throws Throwable {
        MemorySegment s = out.get(PTR, 0);
        String v = s.reinterpret(Long.MAX_VALUE).getString(0);
        stringFree.invokeExact(s);
        return v;
    }

    static String field(String json, String key) {
        Matcher m = Pattern.compile("\"" + key + "\":(\"((?:[^\"\\\\]|\\\\.)*)\"|-?\\d+)").matcher(json);
        if (!m.find()) return "";
        return m.group(2) != null ? m.group(2).replace("\\n", "\n").replace("\\\"", "\"") : m.group(1);
    }

    static int asked = 0;

    /** The approval callback: approves file_write, approves `ls -a` for the rest of the
     *  session (CORREX_APPROVE_FOR_SESSION), denies the rest. It sees the request's context. */
    static int approve(MemorySegment userData, MemorySegment tool, int tier, MemorySegment requestJson) {
        String name = tool.reinterpret(Long.MAX_VALUE).getString(0);
        String request = requestJson.reinterpret(Long.MAX_VALUE).getString(0);
        if (!request.contains("\"context\":{")) throw new IllegalStateException("no context: " + request);
        int answer = name.equals("file_write") ? 1 : request.contains("\"argv\":[\"ls\",\"-a\"]") ? 2 : 0;
        asked++;
        System.out.println("  approver: " + name + " (T" + tier + ") -> "
                + (answer == 1 ? "APPROVE" : answer == 2 ? "APPROVE_FOR_SESSION" : "DENY"));
        return answer;
    }

    static final StringBuilder streamed = new StringBuilder();
    static int pieces = 0;

    /** The chunk callback: prints each piece of the answer as it arrives; 0 = go on. */
    static int onChunk(MemorySegment userData, int kind, MemorySegment text, long len) {
        if (kind != 0) return 0; // CORREX_CHUNK_TEXT
        byte[] bytes = text.reinterpret(len).toArray(ValueLayout.JAVA_BYTE);
        String piece = new String(bytes, java.nio.charset.StandardCharsets.UTF_8);
        System.out.print(piece);
        System.out.flush();
        streamed.append(piece);
        pieces++;
        return 0;
    }

    public static void main(String[] args) throws Throwable {
        String libPath = System.getProperty("correx.lib", "target/release/libcorrex.so");
        try (Arena arena = Arena.ofConfined()) {
            lib = SymbolLookup.libraryLookup(Path.of(libPath), arena);
            runtimeNew = fn("correx_runtime_new", FunctionDescriptor.of(I32, PTR, PTR, PTR));
            runtimeFree = fn("correx_runtime_free", FunctionDescriptor.ofVoid(PTR));
            setApprover = fn("correx_runtime_set_approver", FunctionDescriptor.of(I32, PTR, PTR, PTR, PTR, PTR));
            modelLoad = fn("correx_model_load", FunctionDescriptor.of(I32, PTR, PTR, PTR, PTR));
            modelUnload = fn("correx_model_unload", FunctionDescriptor.of(I32, PTR, PTR, PTR));
            inferStream = fn("correx_infer_stream", FunctionDescriptor.of(I32, PTR, PTR, PTR, PTR, PTR, PTR, PTR, PTR));
            toolExecute = fn("correx_tool_execute", FunctionDescriptor.of(I32, PTR, PTR, PTR, PTR));
            readAll = fn("correx_events_read_all", FunctionDescriptor.of(I32, PTR, ValueLayout.JAVA_LONG, I32, PTR, PTR));
            stringFree = fn("correx_string_free", FunctionDescriptor.ofVoid(PTR));
            errorMessage = fn("correx_error_message", FunctionDescriptor.of(PTR, PTR));
            errorFree = fn("correx_error_free", FunctionDescriptor.ofVoid(PTR));

            Path dir = Files.createTempDirectory("correx-jvm-");
            String config = "{\"v\": 1, \"event_log\": \"" + dir + "/events.db\", \"sandbox_root\": \"" + dir + "/sb\","
                    + " \"tools\": {\"file_write\": {\"enabled\": true, \"allowed_paths\": [\"" + dir + "\"]},"
                    + " \"shell\": {\"enabled\": true, \"allowed_executables\": [\"ls\", \"rm\"]}},"
                    + " \"models\": {\"port\": 18433, \"log_dir\": \"" + dir + "/logs\"},"
                    + " \"approvals\": {\"rules\": [{\"tool\": \"shell\", \"argv_prefix\": [\"rm\"], \"action\": \"forbid\"}]}}";
            MemorySegment err = arena.allocate(PTR);
            MemorySegment rtOut = arena.allocate(PTR);
            check("runtime", (int) runtimeNew.invokeExact(arena.allocateFrom(config), rtOut, err), err);
            MemorySegment rt = rtOut.get(PTR, 0);
            try {
                MethodHandle target = MethodHandles.lookup().findStatic(Demo.class, "approve",
                        MethodType.methodType(int.class, MemorySegment.class, MemorySegment.class, int.class, MemorySegment.class));
                MemorySegment stub = LINKER.upcallStub(target, FunctionDescriptor.of(I32, PTR, PTR, I32, PTR), arena);
                check("approver", (int) setApprover.invokeExact(rt, stub, MemorySegment.NULL, MemorySegment.NULL, err), err);

                System.out.println("Loading gemma-3-270m...");
                String descriptor = "{\"v\": 1, \"model_id\": \"gemma-3-270m\", \"residency\": \"persistent\", \"context_size\": 2048,"
                        + " \"extra_args\": [\"--no-jinja\", \"--chat-template\", \"gemma\"]}";
                check("load", (int) modelLoad.invokeExact(rt, arena.allocateFrom(descriptor), MemorySegment.NULL, err), err);

                System.out.println("Asking: What is the capital of France?");
                String request = "{\"v\": 1, \"context\": {\"entries\": ["
                        + "{\"source\": \"user\", \"content\": \"What is the capital of Italy?\"}, {\"source\": \"model\", \"content\": \"Rome.\"},"
                        + "{\"source\": \"user\", \"content\": \"What is the capital of Germany?\"}, {\"source\": \"model\", \"content\": \"Berlin.\"},"
                        + "{\"source\": \"user\", \"content\": \"What is the capital of France?\"}]},"
                        + " \"config\": {\"temperature\": 0, \"max_tokens\": 2, \"seed\": 7}}";
                MemorySegment out = arena.allocate(PTR);
                MethodHandle chunkTarget = MethodHandles.lookup().findStatic(Demo.class, "onChunk",
                        MethodType.methodType(int.class, MemorySegment.class, int.class, MemorySegment.class, long.class));
                MemorySegment chunkStub = LINKER.upcallStub(chunkTarget, FunctionDescriptor.of(I32, PTR, I32, PTR, ValueLayout.JAVA_LONG), arena);
                System.out.print("  streamed: ");
                check("infer", (int) inferStream.invokeExact(rt, arena.allocateFrom("gemma-3-270m"), arena.allocateFrom(request),
                        MemorySegment.NULL, chunkStub, MemorySegment.NULL, out, err), err);
                System.out.println();
                String answer = take(out);
                if (pieces < 1 || !streamed.toString().equals(field(answer, "text")))
                    throw new IllegalStateException("the streamed pieces (" + streamed + ") differ from the answer: " + answer);
                System.out.println("  answer: " + field(answer, "text").trim() + " (" + pieces + " pieces)");
                System.out.println("  usage: " + field(answer, "prompt_tokens") + " prompt + " + field(answer, "completion_tokens") + " completion tokens");

                String[] tools = {
                    "{\"v\":1,\"session_id\":\"jvm\",\"tool_name\":\"file_write\",\"parameters\":{\"operation\":\"write\",\"path\":\"answer.txt\",\"content\":\"Paris\"}}",
                    "{\"v\":1,\"session_id\":\"jvm\",\"tool_name\":\"shell\",\"parameters\":{\"argv\":[\"ls\",\"-l\"]}}",
                };
                for (String t : tools) {
                    check("tool", (int) toolExecute.invokeExact(rt, arena.allocateFrom(t), out, err), err);
                    String r = take(out);
                    System.out.println("  " + field(r, "status") + ": " + (field(r, "output").isEmpty() ? field(r, "reason") : field(r, "output")));
                    if (t.contains("shell") && !field(r, "kind").equals("not_allowed"))
                        throw new IllegalStateException("a denied run should be not_allowed: " + r);
                }
                // Approved for the session: the second `ls -a ...` is not asked; `rm` is
                // forbidden by the config's rule before anyone is asked.
                String[] more = {
                    "{\"v\":1,\"session_id\":\"jvm-2\",\"tool_name\":\"shell\",\"parameters\":{\"argv\":[\"ls\",\"-a\"]}}",
                    "{\"v\":1,\"session_id\":\"jvm-2\",\"tool_name\":\"shell\",\"parameters\":{\"argv\":[\"ls\",\"-a\",\"-l\"]}}",
                    "{\"v\":1,\"session_id\":\"jvm-2\",\"tool_name\":\"shell\",\"parameters\":{\"argv\":[\"rm\",\"-rf\",\"/tmp/x\"]}}",
                };
                for (String t : more) {
                    check("tool", (int) toolExecute.invokeExact(rt, arena.allocateFrom(t), out, err), err);
                    String r = take(out);
                    System.out.println("  " + field(r, "status") + (field(r, "kind").isEmpty() ? "" : " (" + field(r, "kind") + ")"));
                }
                check("unload", (int) modelUnload.invokeExact(rt, arena.allocateFrom("gemma-3-270m"), err), err);

                System.out.println("\nEvent log:");
                check("events", (int) readAll.invokeExact(rt, 1L, 1000, out, err), err);
                Matcher m = Pattern.compile("\"summary\":\"((?:[^\"\\\\]|\\\\.)*)\"").matcher(take(out));
                while (m.find()) System.out.println("  " + m.group(1));
            } finally {
                runtimeFree.invokeExact(rt);
                try (var paths = Files.walk(dir)) {
                    paths.sorted(java.util.Comparator.reverseOrder()).forEach(p -> p.toFile().delete());
                }
            }
            if (asked != 3) throw new IllegalStateException("the approver was asked " + asked + " times");
        }
    }
}
