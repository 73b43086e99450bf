-- walqueue.pg schema version 2: an index for listing live tasks in pages (SPEC §8b).
--
-- A template like migration 1 (its header says how). It only adds an index, so its
-- compatibility version stays 1: clients of version 1 go on working on a schema at version 2.
--
-- `tasks(status, after=, limit=)` of a ready, leased or dead status reads the live rows of one
-- status in task_id order from the cursor on (sql/calls.sql, page_live): with this index that is
-- an index range scan stopped by the LIMIT, O(limit), not a scan and sort of every live row.
-- Completed tasks page on completed's primary key, and all tasks on task's.

CREATE INDEX live_status_task ON {schema}.live (queue, status, task_id);
