package dev.correx.test;

import dev.correx.Runtime;
import java.nio.file.Files;
import java.nio.file.Path;

/** Loads the native library however the class path and properties say, and opens a runtime. */
public final class LoadCheck {
    public static void main(String[] args) throws Exception {
        Path dir = Files.createTempDirectory("correx-load");
        try (Runtime rt = Runtime.builder().eventLog(dir.resolve("events.db")).build()) {
            System.out.printf("loaded: ABI 0x%x, empty log at position %d%n", Runtime.abiVersion(), rt.events().lastPosition());
        }
        Files.deleteIfExists(dir.resolve("events.db"));
        Files.deleteIfExists(dir.resolve("events.db-wal"));
        Files.deleteIfExists(dir.resolve("events.db-shm"));
        Files.deleteIfExists(dir);
    }
}
