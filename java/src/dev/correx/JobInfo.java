package dev.correx;

import java.util.List;
import java.util.Map;

/** A background job as {@link Jobs#list} shows it: its id, command and status. */
public record JobInfo(String jobId, List<String> command, JobStatus status) {

    static JobInfo from(Map<String, Object> m) {
        return new JobInfo(Json.str(m, "job_id"), Json.strings(m, "command"), JobStatus.from(m));
    }
}
