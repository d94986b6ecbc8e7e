"""The resume kind (`resume` beside `steps`): the run checkpointed after `at_step` steps and
resumed on fewer replicas (`check.ResumeRun`), from where each resumed replica reads (`parts`),
on the ranks that go on (`ranks`), with the resume controls (`controls`)."""
