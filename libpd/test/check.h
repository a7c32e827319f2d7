/* The check macro of libpd's C test programs (pd_check.c, pd_dead.c): a failed condition prints
 * "FAIL: line N: ..." with errno and counts in the program's `fails`, so that one run reports
 * every broken call instead of stopping at the first. */
#ifndef PD_TEST_CHECK_H
#define PD_TEST_CHECK_H

#include <errno.h>
#include <stdio.h>
#include <string.h>

static int fails;

#define CHECK(cond, ...)                                                                   \
	do {                                                                               \
		if (!(cond)) {                                                             \
			printf("FAIL: line %d: ", __LINE__);                               \
			printf(__VA_ARGS__);                                               \
			printf(" (errno %d %s)\n", errno, strerror(errno));                \
			fails++;                                                           \
		}                                                                          \
	} while (0)

#endif
