-- The core line, version 18: reserved. Branch `find` was given version 19 for its indexes,
-- and the runner refuses a gap, so this empty file holds 18 until the branch `operator` (issue
-- 32, resolve/retry/audit) brings its own 0018. DELETE THIS FILE AT MERGE.
SELECT 1;
