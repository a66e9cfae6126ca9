"""Streaming query micro-batches: a Spark Structured Streaming job that answers request
files dropped into a directory, exactly once per request, restartable from its checkpoint.

    intake      request file bytes -> requests (MalformedRequestFile names why a file is unusable)
    grouping    registry of grouping policies (degree: GSM's in-degree scheduler with aging; fifo)
    handler     MicroBatchHandler: one micro-batch -> validated, scheduled, answered rows
    sink        AnswerSink: one atomic directory per batch id (temp dir + rename); read_answers
    progress    one line per micro-batch (requests, errors, p50/p99 latency, mode)
    job         StreamConfig, engine start-up checks, the streaming query and its run loop

The job's entry point is spark_jobs/stream_queries.py. No pyspark import at package import time
(only job.py needs it, and imports it inside its functions).
"""

from sparkgnn.streaming.grouping import GROUPINGS, GroupingError, get_grouping
from sparkgnn.streaming.sink import ANSWER_SCHEMA, AnswerSink, read_answers

__all__ = ["ANSWER_SCHEMA", "AnswerSink", "GROUPINGS", "GroupingError", "get_grouping", "read_answers"]
