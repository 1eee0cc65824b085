package dev.correx;

/** A panic inside correx was caught and the runtime is unusable: close it and open another. */
public class UnusableException extends CorrexException {
    private static final long serialVersionUID = 1L;

    /** An exception with its code and message. */
    public UnusableException(int code, String message) {
        super(code, message);
    }
}
