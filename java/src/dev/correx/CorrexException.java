package dev.correx;

import java.nio.charset.StandardCharsets;

/**
 * A correx call failed: {@link #code()} is the C ABI's {@code CORREX_E_*} status and the message
 * says what failed and what to try. Subclasses name the kinds a program tells apart.
 */
public class CorrexException extends RuntimeException {
    private static final long serialVersionUID = 1L;

    /** A required argument was null. */
    public static final int E_NULL = 1;
    /** An argument is malformed (bad JSON, wrong shape, out of range). */
    public static final int E_INVALID_ARGUMENT = 2;
    /** The runtime config is invalid (the message names the field). */
    public static final int E_CONFIG = 3;
    /** The event log failed (I/O, corruption, locked too long). */
    public static final int E_EVENT_STORE = 4;
    /** An append's expected version did not hold. */
    public static final int E_CONFLICT = 5;
    /** A model could not be loaded or unloaded. */
    public static final int E_MODEL = 6;
    /** An inference failed. */
    public static final int E_INFERENCE = 7;
    /** The call was cancelled. */
    public static final int E_CANCELLED = 8;
    /** A panic inside correx was caught; the runtime is now unusable. */
    public static final int E_PANIC = 9;
    /** The runtime was made unusable by an earlier panic. */
    public static final int E_UNUSABLE = 10;
    /** The model was never loaded through this runtime. */
    public static final int E_UNKNOWN_MODEL = 11;
    /** A tool could not be set up. */
    public static final int E_TOOL_SETUP = 12;
    /** Inferences still ran after the drain timeout; nothing changed. */
    public static final int E_BUSY = 13;
    /** A session step's run waits for a durable approval decision. */
    public static final int E_PENDING = 14;
    /** The named record does not exist. */
    public static final int E_NOT_FOUND = 15;
    /** Java side: the handle was closed. */
    public static final int E_CLOSED = -1;

    private final int code;

    /** An exception with a {@code CORREX_E_*} code and a message. */
    public CorrexException(int code, String message) {
        super(message);
        this.code = code;
    }

    /** The {@code CORREX_E_*} code ({@link #E_CLOSED} for a closed handle). */
    public int code() {
        return code;
    }

    /** The exception for a status, of the subclass that names its kind. */
    public static CorrexException forCode(int code, String message) {
        switch (code) {
            case E_NULL:
            case E_INVALID_ARGUMENT:
                return new InvalidArgumentException(code, message);
            case E_CONFIG:
                return new ConfigException(code, message);
            case E_EVENT_STORE:
                return new EventStoreException(code, message);
            case E_CONFLICT:
                return new ConflictException(code, message);
            case E_MODEL:
                return new ModelException(code, message);
            case E_UNKNOWN_MODEL:
                return new UnknownModelException(code, message);
            case E_BUSY:
                return new BusyException(code, message);
            case E_INFERENCE:
                return new InferenceException(code, message);
            case E_CANCELLED:
                return new CancelledException(code, message);
            case E_PANIC:
            case E_UNUSABLE:
                return new UnusableException(code, message);
            case E_TOOL_SETUP:
                return new ToolSetupException(code, message);
            case E_PENDING:
                return new PendingException(code, message);
            case E_NOT_FOUND:
                return new NotFoundException(code, message);
            default:
                return new CorrexException(code, message);
        }
    }

    /** Called by the native glue. */
    static CorrexException of(int code, byte[] message) {
        return forCode(code, new String(message, StandardCharsets.UTF_8));
    }
}
