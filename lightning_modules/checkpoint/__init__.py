"""Checkpoints: how they are written, read safely, resumed from, and gathered into one file.

- callback.py       Lightning's ModelCheckpoint, plus a checkpoint at the end of fit
- consolidation.py  a one-file checkpoint from a sharded (FSDP) one
- local_io.py       a one-file checkpoint written beside its name, synced and renamed: atomic on any filesystem
- newest.py         the newest checkpoint of a run's folder that can be resumed from, unreadable ones set aside;
                    a run's folders found by its name (fit --ckpt_path auto)
- reader.py         open a checkpoint with weights_only=True and say in one line why one cannot be used
- resume_policy.py  what a resumed run does with settings that differ from the checkpoint's
- step_log.py       the metrics of a step a checkpoint was saved inside, logged on resume
"""
