package dev.correx;

/** The named record does not exist (an approval request the session never made). */
public class NotFoundException extends CorrexException {
    private static final long serialVersionUID = 1L;

    /** An exception with its code and message. */
    public NotFoundException(int code, String message) {
        super(code, message);
    }
}
