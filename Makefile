.PHONY: quickstart test lint
quickstart:
	bash launch/quickstart.sh
test:
	bash launch/test.sh
lint:
	bash -c 'source launch/setup.sh && ruff check . && shellcheck launch/*.sh launch/slurm/*.sbatch .ci/run'
