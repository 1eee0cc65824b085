package dev.correx;

/** The call was cancelled through its {@link Cancellation}, or a stream callback stopped it. */
public class CancelledException extends CorrexException {
    private static final long serialVersionUID = 1L;

    /** An exception with its code and message. */
    public CancelledException(int code, String message) {
        super(code, message);
    }
}
