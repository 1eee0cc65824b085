package dev.correx;

/** Inferences were still running after the drain timeout, or too many loads waited; nothing changed. */
public class BusyException extends ModelException {
    private static final long serialVersionUID = 1L;

    /** An exception with its code and message. */
    public BusyException(int code, String message) {
        super(code, message);
    }
}
