// SPDX-License-Identifier: GPL-2.0
/*
 * nodehealth's VM tier: printk a real-looking Xid and a hung-task line from the kernel itself, so
 * that /dev/kmsg holds records with the kernel's facility (0), which a userspace write never has.
 */
#include <linux/init.h>
#include <linux/module.h>
#include <linux/printk.h>

static char *gpu = "0000:3b:00";
module_param(gpu, charp, 0444);
MODULE_PARM_DESC(gpu, "PCI address in the Xid line");

static int __init nh_printk_init(void)
{
	pr_err("NVRM: Xid (PCI:%s): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus.\n", gpu);
	pr_err("INFO: task python3:4242 blocked for more than 122 seconds.\n");
	return 0;
}

static void __exit nh_printk_exit(void)
{
}

module_init(nh_printk_init);
module_exit(nh_printk_exit);
MODULE_LICENSE("GPL");
MODULE_DESCRIPTION("nodehealth test: kernel-facility Xid and hung-task records");
