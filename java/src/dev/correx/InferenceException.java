package dev.correx;

/** An inference failed (unreachable, timed out, an HTTP error, a broken stream). */
public class InferenceException extends CorrexException {
    private static final long serialVersionUID = 1L;

    /** An exception with its code and message. */
    public InferenceException(int code, String message) {
        super(code, message);
    }
}
