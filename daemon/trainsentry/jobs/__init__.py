"""Jobs: the ranks of one launch and the attempts of one job, told from the runs' ids."""

from trainsentry.jobs.identity import Member, job_of, member_of, rank_in_name, ranked_run, same_job

__all__ = ["Member", "job_of", "member_of", "rank_in_name", "ranked_run", "same_job"]
