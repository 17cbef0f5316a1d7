// Known-answer design 2: 4-state localparam FSM, two-process style, case with default, a ternary
// next-state and && conditions.
module fsm (
  input  logic clk,
  input  logic rst_n,
  input  logic start,
  input  logic din,
  output logic busy
);
  localparam [1:0] IDLE = 2'd0, RUN = 2'd1, DONE = 2'd2, ERR = 2'd3;
  logic [1:0] state, next;
  always_ff @(posedge clk or negedge rst_n) begin
    if (!rst_n) state <= IDLE;
    else        state <= next;
  end
  always_comb begin
    next = state;
    case (state)
      IDLE: if (start && din) next = RUN;
      RUN:  next = din ? DONE : ERR;
      DONE: next = IDLE;
      ERR:  next = IDLE;
      default: ;
    endcase
  end
  assign busy = (state == RUN);
endmodule
