package dev.correx;

/** The runtime config is invalid; the message names the field. */
public class ConfigException extends CorrexException {
    private static final long serialVersionUID = 1L;

    /** An exception with its code and message. */
    public ConfigException(int code, String message) {
        super(code, message);
    }
}
