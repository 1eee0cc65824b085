package dev.correx;

/** The model was never loaded through this runtime. */
public class UnknownModelException extends ModelException {
    private static final long serialVersionUID = 1L;

    /** An exception with its code and message. */
    public UnknownModelException(int code, String message) {
        super(code, message);
    }
}
