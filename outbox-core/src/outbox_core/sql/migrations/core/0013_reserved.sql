-- The core line, version 13: reserved. Another branch of this release (ops21 or speed) adds
-- the real migration 13; this file only keeps the line without a gap (versions must run 1, 2,
-- 3 ...) on the branch that adds migration 14 (trace contexts). Delete it when that branch's
-- 0013 is merged.
SELECT 1;
