package dev.correx;

/** An argument was null or malformed (bad JSON, a NUL byte, the wrong shape). */
public class InvalidArgumentException extends CorrexException {
    private static final long serialVersionUID = 1L;

    /** An exception with its code and message. */
    public InvalidArgumentException(int code, String message) {
        super(code, message);
    }
}
