"""One run, read from its directory: the run directory and its files (``rundir``), run.json
(``run_info``: who runs it, and on which backend), the typed per-rank and launcher events
(``events``) and what the log pane says of them (``event_notices``), what the ranks reported
(``rank_states``), the one throttled step report every rank writes (``step_reporter``), the
figures of a script run (``script_reporting``), the summary (``summary``, ``summarize``), the one
settler of a run whose launcher ended without one (``settle``) and the run observer
(``observer``): the one place that decides a run's and each rank's status, into what one
observation says (``run_state``); the one look at a
run an operation takes before it acts (``run_handle``). Also: where the
processes of a run another backend placed are, as the observer asks that backend's watch
(``placement``), each node's files of a run across nodes (``node_files``), what the ranks ran with
(``recorded_environment``), the root cause of a failure (``root_cause``), every run of a runs
directory as one line (``run_listing``), each rank's step split and the bottleneck
(``step_breakdown``), the per-step curves (``step_curves``), the stop a user asked for
(``stop_request``), what the newest checkpoint holds (``checkpoint_record``) and two runs
compared (``compare``). A run's attempts (``attempts``: kept apart, each with its record; what
an observer knows of them, ``attempt_watch``), the checkpoint a later attempt goes on from
(``resume_point``) and the one decision whether a failed attempt starts again
(``restart_policy``). Never starts or signals a process.
"""
