package dev.correx;

/** An append's expected version did not hold: re-read the stream and retry. */
public class ConflictException extends CorrexException {
    private static final long serialVersionUID = 1L;

    /** An exception with its code and message. */
    public ConflictException(int code, String message) {
        super(code, message);
    }
}
