package dev.correx;

/** A tool could not be set up (a missing allowed path or executable). */
public class ToolSetupException extends CorrexException {
    private static final long serialVersionUID = 1L;

    /** An exception with its code and message. */
    public ToolSetupException(int code, String message) {
        super(code, message);
    }
}
