package dev.correx;

/** The handle (runtime, subscription, cancellation) was closed. */
public class ClosedException extends CorrexException {
    private static final long serialVersionUID = 1L;

    /** An exception with its code and message. */
    public ClosedException(int code, String message) {
        super(code, message);
    }
}
