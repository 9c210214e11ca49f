"""Pipeline parallelism: stages over a ``pp`` mesh axis, microbatch schedules, execution."""
