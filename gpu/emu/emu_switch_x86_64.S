/* The fibers' stack switch on x86-64 (System V), for emu_block.cc: the same
 * contract as Boost.Context's jump_fcontext (the target context, a pointer
 * passed along; returns {the context we came from, that pointer} in rax:rdx,
 * which is also a fresh context's entry function's argument in rdi:rsi), but
 * without saving and restoring MXCSR and the x87 control word: fnstcw, fldcw
 * and ldmxcsr were four fifths of each switch, and no kernel changes them
 * (the emulator rounds in software, emu_half.h). A warp collective switches
 * once per lane, so this is the emulator's innermost loop. */
    .text
    .globl hkv_emu_jump
    .type hkv_emu_jump, @function
    .p2align 4
hkv_emu_jump:
    pushq %rbp
    pushq %rbx
    pushq %r15
    pushq %r14
    pushq %r13
    pushq %r12
    movq %rsp, %rax         /* this context, handed to the target */
    movq %rdi, %rsp         /* the target's stack */
    popq %r12
    popq %r13
    popq %r14
    popq %r15
    popq %rbx
    popq %rbp
    movq %rsi, %rdx         /* {rax, rdx}: the return value */
    movq %rax, %rdi         /* {rdi, rsi}: a fresh context's argument */
    ret
    .size hkv_emu_jump, .-hkv_emu_jump

/* Where a fresh context (hkv_emu_make in emu_block.cc) starts: its entry
 * function is in rbx, the stack 16-byte aligned; it never returns. */
    .globl hkv_emu_trampoline
    .type hkv_emu_trampoline, @function
    .p2align 4
hkv_emu_trampoline:
    callq *%rbx
    ud2
    .size hkv_emu_trampoline, .-hkv_emu_trampoline

    .section .note.GNU-stack, "", @progbits
