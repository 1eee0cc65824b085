package dev.correx;

/** The level of a correx log record. */
public enum LogLevel {
    /** Something failed. */
    ERROR(1),
    /** Something looks wrong. */
    WARN(2),
    /** What happened. */
    INFO(3),
    /** Details. */
    DEBUG(4),
    /** Everything. */
    TRACE(5);

    final int level;

    LogLevel(int level) {
        this.level = level;
    }

    static LogLevel of(int level) {
        for (LogLevel l : values()) {
            if (l.level == level) return l;
        }
        return TRACE;
    }
}
