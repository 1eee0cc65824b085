package dev.correx;

/** A model could not be loaded or unloaded; the message carries the server's last log lines. */
public class ModelException extends CorrexException {
    private static final long serialVersionUID = 1L;

    /** An exception with its code and message. */
    public ModelException(int code, String message) {
        super(code, message);
    }
}
