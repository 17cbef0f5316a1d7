// Harness fixture: parameterised widths, a packed 2-D input, a 72-bit input and a signed input.
module wide_packed #(parameter LANES = 4, parameter LW = 8) (
  input  logic                       clk,
  input  logic                       rst,
  input  logic [LANES-1:0][LW-1:0]   lanes,
  input  logic [71:0]                wide,
  input  logic signed [7:0]          bias,
  input  logic [$clog2(LANES)-1:0]   pick,
  output logic [LW-1:0]              sel_lane,
  output logic                       big,
  output logic signed [9:0]          acc
);
  always_ff @(posedge clk) begin
    if (rst) acc <= '0;
    else if (bias < 0) acc <= acc - 10'sd1;
    else acc <= acc + 10'(bias[3:0]);
  end
  assign sel_lane = lanes[pick];
  assign big = (wide[71:64] == 8'hFF) || (wide[7:0] == 8'h00);
endmodule
